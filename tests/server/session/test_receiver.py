"""A connection's messages received ahead of their handling (`Receiver`), over a real WebSocket on
loopback: what queued while the handler was busy comes back together and in order, the queue stops
at its byte bound (the rest waits in the socket), and the end comes after every message before it."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import websockets
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket

from omnivoice.server.session.receiver import Receiver
from tests.support.polling import until
from tests.support.serve import ServerThread, serve_thread

MESSAGE = "m{:02d}" + "x" * 37  # 40 characters each
BOUND = 100  # bytes: the third message fills the queue


@dataclass
class Handler:
    """The server side: takes, reports each batch taken, then waits for the test's `gate` before
    taking again. `receiver` and the batches are the test's to read."""

    gate: threading.Event = field(default_factory=threading.Event)
    receiver: Receiver | None = None
    batches: list[list[str]] = field(default_factory=list)
    ended: threading.Event = field(default_factory=threading.Event)

    async def serve(self, websocket: WebSocket) -> None:
        await websocket.accept()
        self.receiver = receiver = Receiver(websocket, max_bytes=BOUND)
        try:
            while (taken := await receiver.take()) is not None:
                batch = [m if isinstance(m, str) else m.decode() for m in taken]
                self.batches.append(batch)
                await websocket.send_text(json.dumps(batch))
                await asyncio.to_thread(self.gate.wait)
                self.gate.clear()
        finally:
            await receiver.close()
            self.ended.set()


@pytest.fixture
def served() -> Iterator[tuple[ServerThread, Handler]]:
    handler = Handler()
    app = Starlette(routes=[WebSocketRoute("/ws", handler.serve)])
    with serve_thread(app, wait_healthy=None) as st:
        yield st, handler


async def test_what_queued_meanwhile_is_taken_at_once_in_order(served: tuple[ServerThread, Handler]) -> None:
    st, handler = served
    url = st.base_url.replace("http", "ws") + "/ws"
    async with websockets.connect(url) as ws:
        await ws.send(MESSAGE.format(0))
        assert json.loads(await ws.recv()) == [MESSAGE.format(0)]  # the handler now waits on the gate
        for i in range(1, 11):
            await ws.send(MESSAGE.format(i))
        receiver = handler.receiver
        assert receiver is not None
        # the queue fills to its bound (3 x 40 bytes >= 100) and stays there: the rest waits unread
        await until(lambda: receiver.queued == 3, 10, "three messages queued")
        await asyncio.sleep(0.2)
        assert receiver.queued == 3
        taken = []
        while len(taken) < 10:
            handler.gate.set()
            batch = json.loads(await ws.recv())
            assert 1 <= len(batch) <= 3
            taken += batch
        assert taken == [MESSAGE.format(i) for i in range(1, 11)]
        # messages sent while the handler is busy come back as one batch, however many there are
        await ws.send(MESSAGE.format(11))
        await ws.send(MESSAGE.format(12))
        await until(lambda: receiver.queued == 2, 10, "two messages queued")
        handler.gate.set()
        assert json.loads(await ws.recv()) == [MESSAGE.format(11), MESSAGE.format(12)]
        await ws.send(MESSAGE.format(13))  # sent just before the client leaves: still handled
    handler.gate.set()
    await until(handler.ended.is_set, 10, "the handler's end")
    assert handler.batches[-1] == [MESSAGE.format(13)]
