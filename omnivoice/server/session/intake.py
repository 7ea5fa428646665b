"""How far behind real time a session handles its caller's audio (`IntakeClock`), summed over the
app's sessions (`IntakeStats`, exported on /metrics).

A caller streams audio at real-time pace and the session handles its appends in order (scoring
them, then acting on the turn events they make, some of which wait on the engine). Whatever delays
that work delays every later append of the session, and the turn's end is heard that much later (the
appends that queued meanwhile are then handled as one, `Session.handle_all`). After each append the
clock compares the audio handled so far with the time passed since the session last
caught up: the difference is the backlog, the part of the caller's wait that the server adds before
it even hears the end of the turn. A client that sends faster than real time (a file, a test) moves
the clock's origin instead, so it reads no backlog.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from omnivoice.types import count_into

# upper bounds (seconds) of the backlog histogram's buckets
LAG_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class IntakeStats:
    """Every append's backlog since the app started, as `buckets` counts per LAG_BUCKETS bound (and
    their sum and count)."""

    appends: int = 0
    lag_sum_s: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * len(LAG_BUCKETS))

    def record(self, lag_s: float) -> None:
        self.appends += 1
        self.lag_sum_s += lag_s
        count_into(self.buckets, LAG_BUCKETS, lag_s)


class IntakeClock:
    """One session's clock of the audio it has handled, at `rate` samples a second."""

    def __init__(self, stats: IntakeStats, rate: int) -> None:
        self._stats = stats
        self._rate = rate
        self._origin: float | None = None  # when the audio handled so far would have started, live

    def handled(self, samples: int, now: float | None = None) -> float:
        """The session has handled `samples` of audio in all (an absolute position); its backlog
        (seconds, recorded in the stats)."""
        now = time.monotonic() if now is None else now
        audio_s = samples / self._rate
        if self._origin is None or now - audio_s < self._origin:
            self._origin = now - audio_s  # caught up (or the client ran ahead): no backlog
        lag = now - audio_s - self._origin
        self._stats.record(lag)
        return lag
