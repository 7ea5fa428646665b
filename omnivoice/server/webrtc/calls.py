"""The app's WebRTC calls (`app.state.webrtc`): opened by signalling, each served by its own task,
closed on hang-up, failure or ICE timeout, and all closed at shutdown. Each call holds one realtime
session slot of `RealtimeService`, exactly as a WebSocket does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from omnivoice.server.realtime.conversation import new_id
from omnivoice.server.realtime.ending import shutdown_notice
from omnivoice.server.realtime.outbox import OutboxLimits
from omnivoice.server.realtime.service import RealtimeService
from omnivoice.server.realtime.session import Session
from omnivoice.server.webrtc.channel import DataChannelOutbox
from omnivoice.server.webrtc.peer import Call

if TYPE_CHECKING:
    from omnivoice.server.drain import Drain

log = logging.getLogger(__name__)


class Calls:
    def __init__(
        self,
        service: RealtimeService,
        *,
        profile: Any,
        admission: Any,
        connect_timeout_s: float,
        drain: Drain | None = None,
    ) -> None:
        self._service = service
        self._profile = profile
        self._admission = admission
        self._drain = drain
        self.connect_timeout_s = connect_timeout_s
        self.calls: dict[str, Call] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    async def open(
        self,
        engine: Any,
        offer_sdp: str,
        settings: dict[str, Any] | None,
        on_close: Callable[[], None] = lambda: None,
    ) -> tuple[Call, str]:
        """Start a call from the client's offer; returns it with the SDP answer. `on_close` runs once
        the call is over (or failed to open), e.g. to release its count against an API key.

        Raises SessionLimitReached at the session limit, ValueError for an offer aiortc rejects,
        ProtocolError for bad session `settings` (from a client secret)."""
        if self._closed:
            raise RuntimeError("the server is shutting down")
        self._service.reserve()
        sid = new_id("sess")
        call: Call | None = None
        try:
            outbox = DataChannelOutbox(sid, OutboxLimits.of(self._profile))
            vad = await self._service.vad()
            session = Session(sid, engine, outbox, vad, profile=self._profile, admission=self._admission)
            if settings:
                session.apply_settings(settings)
            call = Call(new_id("rtc"), session, outbox)
            answer = await call.answer(offer_sdp)
        except BaseException:
            if call is not None:
                await call.close()
            self._service.release(None)
            on_close()
            raise
        self._service.sessions[sid] = session
        self.calls[call.id] = call
        task = asyncio.create_task(self._serve(call, on_close), name=f"call-{call.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        log.info("%s opened", call.label)
        return call, answer

    async def _serve(self, call: Call, on_close: Callable[[], None]) -> None:
        drained = asyncio.create_task(self._end_at_shutdown(call), name=f"drain-{call.id}")
        try:
            await call.run(self.connect_timeout_s)
        except Exception:
            log.exception("%s failed", call.label)
            call.hang_up("internal error")
        finally:
            drained.cancel()
            try:
                await call.close()  # flushes the last events (the shutdown notice) on the data channel
            finally:
                self.calls.pop(call.id, None)
                self._service.release(call.session.id)
                on_close()
                log.info("%s closed: %s", call.label, call.end_reason)

    async def _end_at_shutdown(self, call: Call) -> None:
        """The server drains: let the call's response finish (or cancel it at the drain's expiry), say
        so on the data channel, hang up."""
        if self._drain is not None:
            await shutdown_notice(lambda: call.session, self._drain)
            call.hang_up("server shutting down")

    def hang_up(self, call_id: str) -> bool:
        """End the call `call_id` (the client's hang-up); False if there is no such call."""
        call = self.calls.get(call_id)
        if call is None:
            return False
        call.hang_up("hung up by the client")
        return True

    async def close(self) -> None:
        """Shutdown: end every call and wait until each is released."""
        self._closed = True
        for call in list(self.calls.values()):
            call.hang_up("server shutting down")
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
