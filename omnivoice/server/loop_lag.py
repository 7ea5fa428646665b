"""How late the event loop runs what is due: a small task sleeps `interval_s` again and again and
records by how much each wake-up came after its time.

Every callback on the loop (a WebSocket read, a JSON encode, an audio delta, a handler) delays every
other one; a wake-up that comes 50 ms late means that a ping, an audio delta or a `/health` probe
due then waited 50 ms too. The lag is observed into a Prometheus histogram (`omnivoice_event_loop_lag_
seconds`), so a scrape before and after a run gives its distribution over the run. The probe costs one
timer callback per interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from prometheus_client import CollectorRegistry, Histogram

LAG_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
INTERVAL_S = 0.05


class LoopLag:
    """The event loop's lag, sampled every `interval_s` by a task `start()` makes on the running loop."""

    def __init__(self, registry: CollectorRegistry, interval_s: float = INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.histogram = Histogram(
            "omnivoice_event_loop_lag_seconds",
            "How late the event loop woke a task that slept until a given time (sampled every "
            f"{interval_s * 1e3:.0f} ms)",
            buckets=LAG_BUCKETS,
            registry=registry,
        )
        self.worst_s = 0.0  # the largest lag seen
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Begin sampling on the running loop (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._sample(), name="event-loop-lag")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _sample(self) -> None:
        while True:
            due = time.perf_counter() + self.interval_s
            await asyncio.sleep(self.interval_s)
            lag = max(0.0, time.perf_counter() - due)
            self.histogram.observe(lag)
            self.worst_s = max(self.worst_s, lag)
