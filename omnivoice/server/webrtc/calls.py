"""The app's WebRTC calls (`app.state.webrtc`): opened by signalling, each served by its own task,
closed on hang-up, failure or ICE timeout, and all closed at shutdown. Each call's session is admitted
and opened by the app's `Sessions`, exactly as a WebSocket's is, and holds its slot until the call ends.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from omnivoice.server.session.conversation import new_id
from omnivoice.server.session.ending import shutdown_notice
from omnivoice.server.session.outbox import OutboxLimits
from omnivoice.server.session.registry import Sessions, Ticket
from omnivoice.server.webrtc.channel import DataChannelOutbox
from omnivoice.server.webrtc.peer import Call

if TYPE_CHECKING:
    from omnivoice.server.drain import Drain

log = logging.getLogger(__name__)


class Calls:
    def __init__(self, sessions: Sessions, *, connect_timeout_s: float, drain: Drain | None = None) -> None:
        self._sessions = sessions
        self._drain = drain
        self.connect_timeout_s = connect_timeout_s
        self.calls: dict[str, Call] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    async def open(self, owner: str, offer_sdp: str, settings: dict[str, Any] | None) -> tuple[Call, str]:
        """Start a call of API key `owner` from the client's offer; returns it with the SDP answer.

        Raises SessionRefused when no session can open now, RuntimeError once the server shuts down,
        ValueError for an offer aiortc rejects, ProtocolError for bad session `settings` (from a
        client secret). The request was counted against the key by the auth middleware."""
        ticket = await self._sessions.admit(owner, request_counted=True)
        call: Call | None = None
        try:
            if self._closed:
                raise RuntimeError("the server is shutting down")
            outbox = DataChannelOutbox(new_id("sess"), OutboxLimits.of(self._sessions.profile))
            session = await ticket.open(outbox, settings)
            call = Call(new_id("rtc"), session, outbox)
            answer = await call.answer(offer_sdp)
        except BaseException:
            if call is not None:
                await call.close()
            await ticket.close()
            raise
        self.calls[call.id] = call
        task = asyncio.create_task(self._serve(call, ticket), name=f"call-{call.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        log.info("%s opened", call.label)
        return call, answer

    async def _serve(self, call: Call, ticket: Ticket) -> None:
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
                await ticket.close()  # the session's slot and its count against the key
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
