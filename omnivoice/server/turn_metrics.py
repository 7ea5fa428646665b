"""/metrics of semantic_vad's end-of-turn model (session/end_of_turn.py), read at scrape time: how long
each pause waited for its score (queue, features and model), the model's runs and the pauses they
batched, and what the scores decided."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from omnivoice.server.metrics import ScrapedCollector, histogram_family
from omnivoice.server.session.end_of_turn import LATENCY_BUCKETS, JudgeStats


class TurnModelCollector(ScrapedCollector[JudgeStats]):
    def collect(self) -> Iterator[Metric]:
        s = self._source
        yield histogram_family(
            "omnivoice_turn_model_pause_seconds",
            "semantic_vad: a pause's wait for the end-of-turn model's score (queue, features, model)",
            LATENCY_BUCKETS,
            s.latency_buckets,
            s.pauses,
            s.latency_sum_s,
        )
        described = (
            ("runs", s.runs, "Runs of the end-of-turn model (each scores a batch of pauses)"),
            ("run_seconds", s.run_seconds, "Seconds the end-of-turn model's runs took"),
            ("done", s.done, "Pauses the end-of-turn model ended the turn at"),
            ("held", s.held, "Pauses the end-of-turn model held the turn open at"),
            ("failed", s.failed, "Pauses the end-of-turn model failed to score"),
        )
        for key, value, doc in described:
            family = CounterMetricFamily(f"omnivoice_turn_model_{key}", doc)
            family.add_metric([], value)
            yield family
