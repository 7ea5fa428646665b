"""One-use tokens for Twilio media streams. The carrier cannot send our API key on its WebSocket, so
the TwiML webhook (which does need the key) hands the stream a token as a `<Parameter>`, and the
stream's `start` message must bring it back, once, before it expires."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable

PREFIX = "tw_"
PARAMETER = "omnivoice_token"  # the <Parameter> (customParameters key) that carries it
TTL_S = 120.0  # Twilio opens the stream right after it reads the TwiML


class StreamTokens:
    def __init__(self, ttl_s: float = TTL_S, clock: Callable[[], float] = time.time) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._tokens: dict[str, tuple[str, float]] = {}  # value -> (owner key id, expires at)

    def issue(self, owner: str) -> str:
        """A fresh token charged to key `owner`."""
        now = self._clock()
        for value in [v for v, (_, exp) in self._tokens.items() if exp <= now]:
            del self._tokens[value]
        value = PREFIX + secrets.token_urlsafe(24)
        self._tokens[value] = (owner, now + self.ttl_s)
        return value

    def redeem(self, value: str) -> str | None:
        """The owner of the live token `value`, which is used up; None if unknown, used or expired."""
        owner, expires_at = self._tokens.pop(value, ("", 0.0))
        return owner if expires_at > self._clock() else None

    def __len__(self) -> int:
        return len(self._tokens)
