"""Per-key limits: a token bucket of requests per minute and a cap on open realtime sessions.

Over a limit the caller is answered at once (429 with Retry-After over HTTP, an `error` event and
close 1013 over a WebSocket), never queued. Keys are few (the configured ones, or `anonymous`), so
the per-key state is bounded.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from omnivoice.config import RateLimitConfig


class RateLimited(Exception):
    """Over a per-key limit; retry after `retry_after_s` seconds."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = max(1, math.ceil(retry_after_s))


@dataclass
class _Bucket:
    tokens: float
    at: float


class KeyLimits:
    def __init__(self, config: RateLimitConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self.sessions: dict[str, int] = {}

    def take(self, owner: str) -> None:
        """Count one request of key `owner`; RateLimited when its bucket is empty."""
        rpm = self.config.requests_per_minute
        if rpm is None:
            return
        size = float(self.config.burst or rpm)
        rate = rpm / 60.0  # tokens per second
        now = self._clock()
        bucket = self._buckets.setdefault(owner, _Bucket(size, now))
        bucket.tokens = min(size, bucket.tokens + (now - bucket.at) * rate)
        bucket.at = now
        if bucket.tokens < 1.0:
            wait_s = (1.0 - bucket.tokens) / rate
            raise RateLimited(f"rate limit of {rpm} requests per minute reached for this API key", wait_s)
        bucket.tokens -= 1.0

    def claim_session(self, owner: str) -> SessionLease:
        """Count one open realtime session of key `owner`; RateLimited at `max_sessions`."""
        cap = self.config.max_sessions
        open_now = self.sessions.get(owner, 0)
        if cap is not None and open_now >= cap:
            raise RateLimited(f"this API key already has {cap} realtime sessions open", 1.0)
        self.sessions[owner] = open_now + 1
        return SessionLease(self, owner)

    def _release(self, owner: str) -> None:
        left = self.sessions.get(owner, 0) - 1
        if left > 0:
            self.sessions[owner] = left
        else:
            self.sessions.pop(owner, None)


class SessionLease:
    """One session counted against a key; `release()` is idempotent."""

    def __init__(self, limits: KeyLimits, owner: str) -> None:
        self._limits: KeyLimits | None = limits
        self.owner = owner

    def release(self) -> None:
        if self._limits is not None:
            self._limits._release(self.owner)
            self._limits = None
