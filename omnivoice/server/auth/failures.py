"""Failed authentication attempts, throttled per client address.

Without this a client could try keys as fast as the server answers. Each address gets a token bucket
of `auth.max_failed_auth_per_minute` failures; once it is empty, the address's requests are refused
with 429 before any key is looked at (a right key too, so guessing gains nothing) until the bucket
refills. The table of addresses is bounded (`MAX_ADDRESSES`): full buckets are forgotten first, then
the oldest, so a flood of addresses cannot grow memory without bound.

Behind a reverse proxy every client has the proxy's address: raise the limit there, or set it to
null and throttle at the proxy.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from omnivoice.server.auth.limits import RateLimited

MAX_ADDRESSES = 10_000


@dataclass
class _Bucket:
    tokens: float
    at: float


class AuthFailures:
    def __init__(
        self,
        per_minute: int | None,
        clock: Callable[[], float] = time.monotonic,
        max_addresses: int = MAX_ADDRESSES,
    ) -> None:
        self.per_minute = per_minute
        self._clock = clock
        self._max = max_addresses
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()  # least recently failed first

    def __len__(self) -> int:
        return len(self._buckets)

    def check(self, address: str) -> None:
        """RateLimited if `address` has used up its failed attempts."""
        bucket = self._refilled(address)
        if bucket is not None and bucket.tokens < 1.0:
            assert self.per_minute is not None
            wait_s = (1.0 - bucket.tokens) * 60.0 / self.per_minute
            raise RateLimited("too many failed authentication attempts from this address", wait_s)

    def failed(self, address: str) -> None:
        """Count one failed attempt of `address`."""
        if self.per_minute is None:
            return
        bucket = self._refilled(address)
        if bucket is None:
            self._make_room()
            bucket = self._buckets[address] = _Bucket(float(self.per_minute), self._clock())
        bucket.tokens = max(0.0, bucket.tokens - 1.0)
        self._buckets.move_to_end(address)

    def _refilled(self, address: str) -> _Bucket | None:
        bucket = self._buckets.get(address)
        if bucket is None or self.per_minute is None:
            return None
        now, size = self._clock(), float(self.per_minute)
        bucket.tokens = min(size, bucket.tokens + (now - bucket.at) * size / 60.0)
        bucket.at = now
        return bucket

    def _make_room(self) -> None:
        if len(self._buckets) < self._max:
            return
        for address in list(self._buckets):  # forget addresses whose buckets have refilled
            bucket = self._refilled(address)
            if bucket is not None and bucket.tokens >= float(self.per_minute or 0):
                del self._buckets[address]
        while len(self._buckets) >= self._max:
            self._buckets.popitem(last=False)
