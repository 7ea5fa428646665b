"""A front end's side of the supervisor's channel (`FleetMember`): the core's comings and goings,
handed to the front end's engine client, and the questions the front ends put to each other.

A question (`ask`) goes to every other front end through the supervisor, and its answers come back
together; a front end answers each question it is asked with the handler its app registered for
that kind (`answer`), on its event loop. What the other front ends say in answer is all the asker
knows of them: a front end that did not answer within `timeout` is left out.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omnivoice.config import Profile
from omnivoice.engine.core.linked import LinkedEngineClient
from omnivoice.engine.core.packets import PacketLink
from omnivoice.engine.start_progress import StartProgress
from omnivoice.messages import CoreExpect, StartStep
from omnivoice.server.fleet.messages import (
    Answer,
    Answers,
    Ask,
    CoreAttach,
    CoreFailed,
    CoreLost,
    FrontEndUp,
    Query,
    Stop,
)
from omnivoice.server.tally import SharedTally

if TYPE_CHECKING:
    from omnivoice.models.dummy_source import DummySource

log = logging.getLogger(__name__)

ASK_TIMEOUT_S = 5.0


class FleetMember:
    def __init__(
        self, index: int, count: int, sock: socket.socket, source: Path | DummySource, tally: SharedTally
    ) -> None:
        self.index = index
        self.count = count  # front ends of the server
        self.source = source
        self.tally = tally
        self._link = PacketLink(sock)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: LinkedEngineClient | None = None
        self._progress: StartProgress | None = None
        self._held: list[tuple[Any, list[int]]] = []  # core events before the client exists
        self._asked: dict[int, asyncio.Future[tuple[Any, ...]]] = {}
        self._seq = 0
        self._handlers: dict[type, Callable[[Any], Any]] = {}
        self._stop: Callable[[], None] | None = None
        self._stops = 0  # Stop messages before there was a server to stop

    def start(self) -> None:
        """Read the supervisor's channel on the running loop."""
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._link.fileno(), self._readable)

    def on_stop(self, stop: Callable[[], None]) -> None:
        """Call `stop()` for each Stop the supervisor sends (the server's own signal handling)."""
        self._stop = stop
        for _ in range(self._stops):
            stop()

    def answer(self, kind: type, handler: Callable[[Any], Any]) -> None:
        """Answer questions of `kind` with `handler(query)` (a value, or an awaitable of one)."""
        self._handlers[kind] = handler

    async def ask(self, query: Query, timeout: float = ASK_TIMEOUT_S) -> tuple[Any, ...]:
        """`query` put to every other front end: their answers (those that came within `timeout`)."""
        if self.count <= 1 or self._loop is None:
            return ()
        self._seq += 1
        seq = self._seq
        future: asyncio.Future[tuple[Any, ...]] = self._loop.create_future()
        self._asked[seq] = future
        try:
            self._link.send(Ask(seq, query))
            return await asyncio.wait_for(future, timeout)
        except (OSError, TimeoutError):
            log.warning("front end %d: no answer to %s", self.index, type(query).__name__)
            return ()
        finally:
            self._asked.pop(seq, None)

    async def engine(self, profile: Profile, progress: StartProgress) -> LinkedEngineClient:
        """The front end's engine client (the app's engine factory): waits for the first core."""
        progress.quiet()  # the supervisor logs the core's start
        self._progress = progress
        held, self._held = self._held, []
        for msg, fds in held:
            if isinstance(msg, StartStep | CoreExpect):
                self._core_event(msg, fds)
            else:
                self._held.append((msg, fds))
        client = await LinkedEngineClient.start_linked(profile, self.source, progress)
        self._client = client
        held, self._held = self._held, []
        for msg, fds in held:
            self._core_event(msg, fds)
        await client.wait_attached()
        return client

    def up(self) -> None:
        """Tell the supervisor this front end serves."""
        self._link.send(FrontEndUp(self.index, os.getpid()))

    def close(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(OSError, ValueError):
                self._loop.remove_reader(self._link.fileno())
        self._link.close()

    # -- on the loop

    def _readable(self) -> None:
        for msg, fds in self._link.recv_available():
            try:
                self._message(msg, fds)
            except Exception:
                log.exception("front end %d: could not handle %s", self.index, type(msg).__name__)
        if self._link.ended and self._loop is not None:
            self._loop.remove_reader(self._link.fileno())
            log.error("front end %d: the supervisor's channel closed", self.index)

    def _message(self, msg: Any, fds: list[int]) -> None:
        if isinstance(msg, Ask):
            assert self._loop is not None
            self._loop.create_task(self._answer(msg), name="fleet-answer")
        elif isinstance(msg, Stop):
            if self._stop is not None:
                self._stop()
            else:
                self._stops += 1
        elif isinstance(msg, Answers):
            future = self._asked.get(msg.seq)
            if future is not None and not future.done():
                future.set_result(msg.values)
        else:
            self._core_event(msg, fds)

    def _core_event(self, msg: Any, fds: list[int]) -> None:
        client = self._client
        if isinstance(msg, StartStep | CoreExpect) and self._progress is not None and client is None:
            if isinstance(msg, StartStep):
                self._progress.record(msg)
            else:
                self._progress.expect(msg.times, msg.total_s)
            return
        if client is None:
            self._held.append((msg, fds))
            return
        if isinstance(msg, CoreAttach):
            client.core_attached(msg.generation, msg.pid, socket.socket(fileno=fds[0]))
        elif isinstance(msg, CoreLost):
            client.core_lost(msg.generation, msg.failure, msg.restarting)
        elif isinstance(msg, CoreFailed):
            client.core_failed(msg.error)
        elif isinstance(msg, StartStep | CoreExpect):
            client.start_step(msg)
        else:
            log.error("front end %d: unexpected message %s", self.index, type(msg).__name__)

    async def _answer(self, ask: Ask) -> None:
        handler = self._handlers.get(type(ask.query))
        value: Any = None
        if handler is not None:
            try:
                value = handler(ask.query)
                if inspect.isawaitable(value):
                    value = await value
            except Exception:
                log.exception("front end %d: could not answer %s", self.index, type(ask.query).__name__)
                value = None
        with contextlib.suppress(OSError):
            self._link.send(Answer(ask.seq, ask.origin, value))
