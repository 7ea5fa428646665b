"""Graceful shutdown: on SIGTERM (or SIGINT) the server drains before it exits.

    signal  -> draining: new HTTP requests get 503 `server_shutting_down`, new WebSockets are refused,
               nothing new is admitted (chat requests, realtime responses, WebRTC calls); realtime
               sessions with no response in flight are closed (an `error` event, then close 1001)
            -> in-flight responses finish, for at most `server.drain_timeout_s`
            -> expired: what is left is cancelled with a notice (SSE: a last error chunk; realtime: an
               `error` event, then close 1001; WebRTC: the notice on the data channel, then the peer
               closes; Twilio: close 1001)
            -> uvicorn's own shutdown: listeners and connections closed, the lifespan stops the engine
From the first signal on, a stage worker that dies is not restarted (`Drain.on_start`, see
EngineLifecycle): its requests fail, the others go on finishing. Stage processes ignore the signal
themselves (one sent to the whole process group reaches them too); the engine stops them at the end.
A second signal cuts the wait short (the rest is cancelled with the notice at once); a third exits
without waiting for anything (uvicorn's force exit).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from omnivoice.server.errors import shutting_down

log = logging.getLogger(__name__)

CLOSE_TRY_AGAIN = 1013
NOTICE_GRACE_S = 5.0  # after expiry: time for cancelled responses to send their notice and close


class Drain:
    """The app's shutdown state (`app.state.drain`): `started` when the drain begins, `expired` when
    what is still running must be cancelled."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.started = asyncio.Event()
        self.expired = asyncio.Event()
        self._on_start: list[Callable[[], None]] = []

    @property
    def draining(self) -> bool:
        return self.started.is_set()

    def on_start(self, callback: Callable[[], None]) -> None:
        """Call `callback` when the drain starts (at once if it has)."""
        self._on_start.append(callback)
        if self.draining:
            callback()

    async def run(self, busy: Callable[[], int]) -> None:
        """Refuse new work, wait until `busy()` (work in flight) is 0 or the timeout passes, then
        expire: the rest is cancelled with a notice; returns once it has gone (or after a grace)."""
        if not self.draining:
            self.started.set()
            for callback in self._on_start:
                callback()
        log.info("draining: %d in flight; waiting up to %g s for them", busy(), self.timeout_s)
        await _wait_idle(busy, self.timeout_s, self.expired)
        if busy():
            log.warning("drain: %d still in flight; cancelling them with a notice", busy())
        self.expired.set()
        await _wait_idle(busy, NOTICE_GRACE_S, None)
        log.info("drained (%d left)", busy())


async def _wait_idle(busy: Callable[[], int], timeout_s: float, cut: asyncio.Event | None) -> None:
    deadline = time.monotonic() + timeout_s
    while busy() and time.monotonic() < deadline and not (cut is not None and cut.is_set()):
        await asyncio.sleep(0.05)


def in_flight(state: Any) -> int:
    """Work the drain waits for: admitted chat requests and realtime responses, open sessions."""
    return int(state.admission.in_flight) + len(state.realtime.sessions)


class DrainMiddleware:
    """While draining: new HTTP requests get 503 (`/health` too, from its route) and new WebSockets
    are closed 1013 (try again later) right after the handshake, the reason in the close frame."""

    def __init__(self, app: ASGIApp, drain: Drain) -> None:
        self.app = app
        self.drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if not self.drain.draining or kind not in ("http", "websocket") or scope["path"] == "/health":
            await self.app(scope, receive, send)
            return
        refusal = shutting_down()
        if kind == "http":
            await refusal.response()(scope, receive, send)
            return
        # accepted, then closed with the reason: uvicorn logs an HTTP denial of a WebSocket as an error
        ws = WebSocket(scope, receive, send)
        await ws.accept()
        await ws.close(CLOSE_TRY_AGAIN, refusal.message)


class DrainingServer(uvicorn.Server):
    """uvicorn whose first SIGTERM/SIGINT drains (`Drain.run`) before uvicorn's own graceful shutdown.
    The signal is handled, not re-raised at exit (uvicorn's default), so the process exits 0."""

    def __init__(
        self, config: uvicorn.Config, drain: Drain, busy: Callable[[], int], own_signals: bool = True
    ) -> None:
        """`own_signals` False: the process's signals are not this server's (a front end of several,
        server/fleet/: its supervisor says when to stop, through `stop`)."""
        super().__init__(config)
        self._drain = drain
        self._busy = busy
        self._own_signals = own_signals
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining: asyncio.Task[None] | None = None
        self.signals = 0

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if not self._own_signals:
            yield
            return
        with super().capture_signals():
            yield

    def stop(self) -> None:
        """As a SIGTERM would: drain first, then cancel what is in flight, then exit at once."""
        self.handle_exit(signal.SIGTERM, None)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # a signal handler: it runs between two bytecodes of the loop's thread; hand over to the loop
        self.signals += 1
        name = signal.Signals(sig).name
        if self._loop is None:
            self.should_exit = True
        elif self.signals == 1:
            log.info("%s: draining for up to %g s", name, self._drain.timeout_s)
            self._loop.call_soon_threadsafe(self._start)
        elif self.signals == 2:
            log.warning("%s again: cancelling what is still in flight", name)
            self._loop.call_soon_threadsafe(self._drain.expired.set)
        else:
            log.warning("%s again: exiting now", name)
            self.should_exit = self.force_exit = True

    def _start(self) -> None:
        self._draining = asyncio.create_task(self._drain_then_exit(), name="drain")

    async def _drain_then_exit(self) -> None:
        try:
            await self._drain.run(self._busy)
        finally:
            self.should_exit = True
