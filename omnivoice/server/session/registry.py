"""The app's realtime sessions (`app.state.realtime`, made by `create_app`): the open ones, bounded by
realtime.max_sessions, the Silero VAD, the front door that scores their input audio and the
end-of-turn model they share, and the one way every transport opens one.

Opening is admission first (`Sessions.admit`): the engine must be up, the API key within its request
rate (unless the auth middleware already counted the request) and its cap of open sessions, the
server within its session limit, and the engine able to serve one more audio stream in real time
(its measured capacity, against the streams already promised: `Admission.promise_stream`). Any of
them refuses with `SessionRefused`, whose `kind` each transport turns into its protocol's answer (an
`error` event and close 1013, a close 1013, HTTP 429 or 503). The admitted `Ticket` opens the
`Session` (`Ticket.open`) and, once the connection is over, however it ended, releases all of it
(`Ticket.close`). `Sessions.open` does both around an `async with`, for a transport whose session
lives as long as one block.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

from omnivoice.audio.front_door import FrontDoor
from omnivoice.audio.vad import SileroVad
from omnivoice.config import Profile
from omnivoice.engine.api import EngineAPI
from omnivoice.server.auth.limits import KeyLimits, RateLimited, SessionLease
from omnivoice.server.errors import APIError
from omnivoice.server.lifecycle import Admission, EngineLifecycle, Slot
from omnivoice.server.session.delivery import DeliveryStats
from omnivoice.server.session.end_of_turn import TurnJudge
from omnivoice.server.session.intake import IntakeStats
from omnivoice.server.session.outbox import Outbox
from omnivoice.server.session.session import Session
from omnivoice.server.session.speculation import SpeculationStats
from omnivoice.server.tally import Tally

log = logging.getLogger(__name__)

RefusalKind = Literal["rate_limited", "session_limit", "capacity", "unavailable"]


class SessionRefused(Exception):
    """No session now: over the key's limits (`rate_limited`, retry after `retry_after_s`), the server
    at its session limit (`session_limit`) or at the engine's measured capacity (`capacity`), or no
    engine to serve it (`unavailable`)."""

    def __init__(self, kind: RefusalKind, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.retry_after_s = retry_after_s


class Sessions:
    """`lifecycle` gives the engine (`require()`), `admission` the slot each response takes, `limits`
    the per-key limits; `vad` is loaded on first use unless given. `front_door` (the app's, which
    closes it; default: one without threads, each append scored alone) converts and scores every
    session's input audio. `speculation` counts the sessions' speculative responses; `judge` is semantic_vad's
    end-of-turn model, shared by them."""

    def __init__(
        self,
        profile: Profile,
        lifecycle: EngineLifecycle,
        admission: Admission,
        limits: KeyLimits,
        vad: SileroVad | None = None,
        front_door: FrontDoor | None = None,
        tally: Tally | None = None,
    ) -> None:
        """`tally`: where the session slots held are counted (shared by the front ends of one
        server, server/fleet/shared.py, which then hold `realtime.max_sessions` together)."""
        self.profile = profile
        self.config = profile.realtime
        self.sessions: dict[str, Session] = {}
        self._lifecycle = lifecycle
        self.admission = admission
        self._limits = limits
        self._tally = tally if tally is not None else Tally(("sessions",))
        self._vad = vad
        self._vad_lock = asyncio.Lock()
        self.front_door = front_door if front_door is not None else FrontDoor(workers=0)
        self.speculation = SpeculationStats()
        self.intake = IntakeStats()  # how far behind their callers the sessions handle audio
        self.delivery = DeliveryStats()  # how soon, and how steadily, the responses' audio left
        self.judge = TurnJudge(
            threads=self.config.turn_model_threads, runs=self.config.turn_model_runs
        )  # loaded once semantic_vad is used

    async def admit(self, owner: str, *, request_counted: bool = False) -> Ticket:
        """Admit a session of API key `owner`, or raise SessionRefused. `request_counted`: the auth
        middleware has already counted the request against the key's rate (an HTTP request)."""
        try:
            engine = self._lifecycle.require()
        except APIError as e:
            raise SessionRefused("unavailable", e.message) from None
        try:
            if not request_counted:
                self._limits.take(owner)
            lease = self._limits.claim_session(owner)
        except RateLimited as e:
            raise SessionRefused("rate_limited", e.message, e.retry_after_s) from None
        if not self._tally.add("sessions", 1, self.config.max_sessions):
            lease.release()
            limit = self.config.max_sessions
            message = f"the server is at its limit of {limit} realtime sessions; retry later"
            raise SessionRefused("session_limit", message)
        try:
            stream = self.admission.promise_stream()
        except APIError as e:
            lease.release()
            self._tally.add("sessions", -1)
            raise SessionRefused(
                "capacity" if e.code == "server_overloaded" else "unavailable", e.message
            ) from None
        return Ticket(self, engine, lease, stream)

    @asynccontextmanager
    async def open(
        self, owner: str, outbox: Outbox, *, settings: dict[str, Any] | None = None
    ) -> AsyncIterator[Session]:
        """Admit and open a session (SessionRefused if it cannot be); closed and released on exit."""
        ticket = await self.admit(owner)
        try:
            yield await ticket.open(outbox, settings)
        finally:
            await ticket.close()

    @property
    def reserved(self) -> int:
        """Session slots held (a session, call or Twilio stream that has not yet ended), by every
        front end of the server."""
        return int(self._tally["sessions"])

    def _release(self, session_id: str | None) -> None:
        self._tally.add("sessions", -1)
        if session_id is not None:
            self.sessions.pop(session_id, None)

    async def vad(self) -> SileroVad:
        """The Silero VAD model, loaded (in a thread) on first use and shared by all sessions."""
        async with self._vad_lock:
            if self._vad is None:
                self._vad = await asyncio.to_thread(SileroVad)
                log.info("silero VAD loaded")
            return self._vad


class Ticket:
    """One admitted session: the engine it runs on, its slot among the server's sessions, its count
    against the API key and its promised audio stream, all held until `close`."""

    def __init__(self, sessions: Sessions, engine: EngineAPI, lease: SessionLease, stream: Slot) -> None:
        self.engine = engine
        self.session: Session | None = None
        self._sessions: Sessions | None = sessions
        self._lease = lease
        self._stream = stream
        self._session_id: str | None = None

    async def open(self, outbox: Outbox, settings: dict[str, Any] | None = None) -> Session:
        """The session behind `outbox` (its id is the outbox's), with `settings` (a `session.update`
        object: ProtocolError if refused) applied, listed among the app's sessions."""
        sessions = self._sessions
        assert sessions is not None and self.session is None, "a ticket opens one session"
        session = Session(
            outbox.session_id,
            self.engine,
            outbox,
            await sessions.vad(),
            profile=sessions.profile,
            admission=sessions.admission,
            speculation=sessions.speculation,
            judge=sessions.judge,
            front_door=sessions.front_door,
            intake=sessions.intake,
            delivery=sessions.delivery,
        )
        self.session = session  # closed by `close` even if its settings are refused
        if settings:
            session.apply_settings(settings)
        sessions.sessions[session.id] = session
        self._session_id = session.id
        return session

    async def close(self) -> None:
        """Close the session (its response aborted in every engine stage) and give back its slot and
        its count against the key; idempotent."""
        session, self.session = self.session, None
        try:
            if session is not None:
                await session.close()
        finally:
            sessions, self._sessions = self._sessions, None
            if sessions is not None:
                sessions._release(self._session_id)
            self._lease.release()
            self._stream.release()
