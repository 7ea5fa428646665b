"""/metrics of the front door (audio/front_door.py), read at scrape time: its ticks, the appends they
scored, the time its workers were busy and the time the appends waited for a worker; and how far
behind their callers the sessions handle their audio (session/intake.py)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from omnivoice.audio.front_door import FrontDoor
from omnivoice.server.metrics import ScrapedCollector, histogram_family
from omnivoice.server.session.intake import LAG_BUCKETS, IntakeStats


class FrontDoorCollector(ScrapedCollector[FrontDoor]):
    def collect(self) -> Iterator[Metric]:
        d = self._source
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


class IntakeCollector(ScrapedCollector[IntakeStats]):
    def collect(self) -> Iterator[Metric]:
        s = self._source
        yield histogram_family(
            "omnivoice_realtime_intake_lag_seconds",
            "How far behind real time a session had handled its caller's audio, after each append",
            LAG_BUCKETS,
            s.buckets,
            s.appends,
            s.lag_sum_s,
        )
