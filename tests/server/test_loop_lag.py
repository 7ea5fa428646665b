"""The event loop's lag (server/loop_lag.py): a callback that holds the loop shows as a late wake-up."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry

from omnivoice.server.loop_lag import LoopLag


async def test_a_blocked_loop_shows_as_lag() -> None:
    registry = CollectorRegistry()
    lag = LoopLag(registry, interval_s=0.01)
    lag.start()
    try:
        await asyncio.sleep(0.05)
        time.sleep(0.2)  # hold the loop, as a blocking call in a handler would
        await asyncio.sleep(0.05)
    finally:
        await lag.stop()
    assert lag.worst_s >= 0.15
    count = registry.get_sample_value("omnivoice_event_loop_lag_seconds_count")
    assert count is not None and count >= 2
    over = registry.get_sample_value("omnivoice_event_loop_lag_seconds_bucket", {"le": "0.1"})
    assert over is not None and over < count  # the late wake-up is past the 100 ms bucket
