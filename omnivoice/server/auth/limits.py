"""Per-key limits: a token bucket of requests per minute and a cap on open realtime sessions.

Over a limit the caller is answered at once (429 with Retry-After over HTTP, an `error` event and
close 1013 over a WebSocket), never queued. Keys are few (the configured ones, or `anonymous`), so
the per-key state is bounded. Each key's figures are kept in a tally (`owner_figures`): the front
ends of one server (server/fleet/) share theirs, so a key's limits are the server's, not each front
end's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from omnivoice.config import RateLimitConfig
from omnivoice.server.tally import Tally


class RateLimited(Exception):
    """Over a per-key limit; retry after `retry_after_s` seconds."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = max(1, math.ceil(retry_after_s))


def owner_figures(owner: str) -> tuple[str, str, str]:
    """The names of key `owner`'s figures in a tally: open sessions, the tokens its bucket lacks, and
    when that was counted (the bucket refills from then on)."""
    return f"sessions:{owner}", f"spent:{owner}", f"at:{owner}"


class KeyLimits:
    def __init__(
        self, config: RateLimitConfig, clock: Callable[[], float] = time.monotonic, tally: Tally | None = None
    ) -> None:
        """`tally`: where the keys' figures are kept (every process of the server shares the clock
        of `time.monotonic`, so a shared bucket refills alike in each)."""
        self.config = config
        self._clock = clock
        self._tally = tally if tally is not None else Tally()

    def take(self, owner: str) -> None:
        """Count one request of key `owner`; RateLimited when its bucket is empty."""
        rpm = self.config.requests_per_minute
        if rpm is None:
            return
        size = float(self.config.burst or rpm)
        rate = rpm / 60.0  # tokens per second
        _, spent_name, at_name = owner_figures(owner)
        with self._tally.locked():
            now = self._clock()
            spent = max(0.0, self._tally[spent_name] - (now - self._tally[at_name]) * rate)
            tokens = size - spent
            self._tally[at_name] = now
            if tokens < 1.0:
                self._tally[spent_name] = spent
                wait_s = (1.0 - tokens) / rate
                raise RateLimited(f"rate limit of {rpm} requests per minute reached for this API key", wait_s)
            self._tally[spent_name] = spent + 1.0

    def sessions(self, owner: str) -> int:
        """Realtime sessions of key `owner` open now."""
        return int(self._tally[owner_figures(owner)[0]])

    def open_sessions(self) -> dict[str, int]:
        """Each key with realtime sessions open now, and how many."""
        counts = {
            n.removeprefix("sessions:"): int(self._tally[n])
            for n in self._tally.names()
            if n.startswith("sessions:")
        }
        return {owner: n for owner, n in counts.items() if n}

    def claim_session(self, owner: str) -> SessionLease:
        """Count one open realtime session of key `owner`; RateLimited at `max_sessions`."""
        cap = self.config.max_sessions
        if not self._tally.add(owner_figures(owner)[0], 1, cap):
            raise RateLimited(f"this API key already has {cap} realtime sessions open", 1.0)
        return SessionLease(self, owner)

    def _release(self, owner: str) -> None:
        self._tally.add(owner_figures(owner)[0], -1)


class SessionLease:
    """One session counted against a key; `release()` is idempotent."""

    def __init__(self, limits: KeyLimits, owner: str) -> None:
        self._limits: KeyLimits | None = limits
        self.owner = owner

    def release(self) -> None:
        if self._limits is not None:
            self._limits._release(self.owner)
            self._limits = None
