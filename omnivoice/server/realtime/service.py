"""App-wide realtime state, made by `create_app`: the open sessions (bounded), the VAD model and the
client secrets."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from omnivoice.audio.vad import SileroVad
from omnivoice.config import RealtimeConfig
from omnivoice.server.realtime.client_secrets import ClientSecrets

if TYPE_CHECKING:
    from omnivoice.server.realtime.session import Session

log = logging.getLogger(__name__)


class SessionLimitReached(Exception):
    pass


class RealtimeService:
    def __init__(self, config: RealtimeConfig) -> None:
        self.config = config
        self.sessions: dict[str, Session] = {}
        self._reserved = 0
        self._vad: SileroVad | None = None
        self._vad_lock = asyncio.Lock()
        self.secrets = ClientSecrets()

    def reserve(self) -> None:
        """Claim a session slot or raise SessionLimitReached; pair with `release`."""
        if self._reserved >= self.config.max_sessions:
            raise SessionLimitReached(
                f"the server is at its limit of {self.config.max_sessions} realtime sessions; retry later"
            )
        self._reserved += 1

    @property
    def reserved(self) -> int:
        """Session slots held (a session, call or Twilio stream that has not yet ended)."""
        return self._reserved

    def release(self, session_id: str | None) -> None:
        self._reserved -= 1
        if session_id is not None:
            self.sessions.pop(session_id, None)

    async def vad(self) -> SileroVad:
        """The Silero VAD model, loaded (in a thread) on first use and shared by all sessions."""
        async with self._vad_lock:
            if self._vad is None:
                self._vad = await asyncio.to_thread(SileroVad)
                log.info("silero VAD loaded")
            return self._vad
