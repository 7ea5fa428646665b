"""A WebSocket's client messages, received ahead of their handling (`Receiver`), so that a connection
whose handling fell behind its caller takes everything waiting at once.

A caller streams audio at real-time pace, one small message every 20 ms or so, and a session handles
its messages in order. Read one at a time, each message waits for the one before it to be handled in
full (scored by the front door, acted on): whenever that takes longer than the caller's pace, the
session falls behind, and with one message per step it never catches up. Here a task receives the
messages as they come and `take` returns all that have queued since the last call, so the session
hands each run of appends (up to `turns.RUN_APPENDS`) to the front door as one
(`Session.handle_all`, `TwilioCall.handle_all`) and a session that fell behind catches up in a few
steps.

The queue is bounded by `max_bytes`: while it holds that much the task stops receiving, so a client
that sends faster than the server handles is held back by the socket's flow control, as before.
"""

from __future__ import annotations

import asyncio
from collections import deque

from starlette.websockets import WebSocket

# what may wait to be handled, at most: ~16 s of 24 kHz pcm16 as base64 appends
READ_AHEAD_BYTES = 1 << 20


class Receiver:
    """`websocket`'s messages (text or bytes), received by a task of their own from construction on;
    `close()` when done. `max_bytes` bounds what may wait (one message is always taken in)."""

    def __init__(self, websocket: WebSocket, max_bytes: int = READ_AHEAD_BYTES) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be > 0, got {max_bytes}")
        self._websocket = websocket
        self._max_bytes = max_bytes
        self._queue: deque[str | bytes] = deque()
        self._bytes = 0
        self._arrived = asyncio.Event()  # a message (or the end) is there to take
        self._room = asyncio.Event()  # the queue is below its bound
        self._room.set()
        self._ended = False  # the client disconnected, or receiving failed (`_error`)
        self._error: BaseException | None = None
        self._task = asyncio.create_task(self._receive(), name="websocket-receiver")

    @property
    def queued(self) -> int:
        """Messages received and not yet taken."""
        return len(self._queue)

    async def _receive(self) -> None:
        try:
            while True:
                await self._room.wait()
                message = await self._websocket.receive()
                if message["type"] == "websocket.disconnect":
                    return
                data = message.get("text")
                if data is None:
                    data = message.get("bytes") or b""
                self._queue.append(data)
                self._bytes += len(data)
                if self._bytes >= self._max_bytes:
                    self._room.clear()
                self._arrived.set()
        except Exception as e:  # the socket failed: `take` raises it once the queue is empty
            self._error = e
        finally:
            self._ended = True
            self._arrived.set()

    async def take(self) -> list[str | bytes] | None:
        """Every message received since the last call, in order (waiting for one); None once the
        client has disconnected and everything before that was taken. Raises what made receiving fail
        (after the messages received before it)."""
        while not self._queue:
            if self._ended:
                if self._error is not None:
                    raise self._error
                return None
            self._arrived.clear()
            await self._arrived.wait()
        taken = list(self._queue)
        self._queue.clear()
        self._bytes = 0
        self._room.set()
        return taken

    async def close(self) -> None:
        """Stop receiving; what is still queued is dropped."""
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
