"""/metrics of the front door (audio/front_door.py), read at scrape time: its ticks, the appends they
scored, the time its workers were busy and the time the appends waited for a worker."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from omnivoice.audio.front_door import FrontDoor


class FrontDoorCollector(Collector):
    def __init__(self, door: FrontDoor) -> None:
        self._door = door

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        d = self._door
        described = (
            ("ticks", d.ticks, "Batches the front door scored (each every session's appends pending then)"),
            ("appends", d.jobs, "Realtime appends the front door's workers scored"),
            ("busy_seconds", d.busy_s, "Seconds the front door's workers spent scoring"),
            ("wait_seconds", d.waited_s, "Seconds the appends waited for a worker, summed"),
        )
        for key, value, doc in described:
            family = CounterMetricFamily(f"omnivoice_front_door_{key}", doc)
            family.add_metric([], value)
            yield family
