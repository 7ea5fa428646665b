"""Real-time pacing of a response's audio: it leaves as soon as it is decoded, but never more than
`ahead_s` ahead of playback, so that a barge-in finds little audio queued at the client."""

from __future__ import annotations

import asyncio
import time


class Pacer:
    """Holds audio back so that at most `ahead_s` seconds are queued beyond real-time playback."""

    def __init__(self, ahead_s: float) -> None:
        self.ahead_s = ahead_s
        self.dry_s = 0.0  # seconds a player starting at the first audio would have waited, so far
        self._start: float | None = None
        self._queued_s = 0.0

    async def wait(self, seconds: float, stop: asyncio.Event) -> bool:
        """Call before sending `seconds` more audio; False (send nothing more) once `stop` is set."""
        now = time.monotonic()
        if self._start is None:
            self._start = now
        lead = self._queued_s - (now - self._start)
        if lead < 0:  # the player ran dry (generation was slower): it restarts at this chunk
            self._start -= lead
            self.dry_s -= lead
            lead = 0.0
        if lead > self.ahead_s:
            try:
                async with asyncio.timeout(lead - self.ahead_s):
                    await stop.wait()
            except TimeoutError:
                pass
        if stop.is_set():
            return False
        self._queued_s += seconds
        return True
