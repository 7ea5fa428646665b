"""Prometheus metrics of one app: request latencies, throughput, and the engine's stage gauges.

Each `Metrics` owns its `CollectorRegistry`, so several apps (tests) never share counters.
Latencies follow vLLM-Omni's benchmark definitions, measured server-side from the moment the
request arrived: TTFT to the first text sent, time to first audio sent, and RTF = time of the
last audio chunk sent / seconds of audio produced.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from omnivoice.engine.types import EngineStats

_LATENCY_BUCKETS = (0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)
_RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)

# Values of the `status` label of omnivoice_requests_total.
STATUSES = ("ok", "cancelled", "error", "invalid", "rejected", "unavailable")


class EngineStatsCollector(Collector):
    """Reads `engine.stats()` at scrape time; exports nothing while the engine is not up."""

    def __init__(self, get_stats: Callable[[], EngineStats | None]) -> None:
        self._get_stats = get_stats

    def describe(self) -> list[Metric]:
        return []  # metrics are only known at scrape time; don't call the engine at registration

    def collect(self) -> Iterator[Metric]:
        stats = self._get_stats()
        if stats is None:
            return
        queued = GaugeMetricFamily("omnivoice_stage_queued", "Requests waiting in a stage", labels=["stage"])
        running = GaugeMetricFamily(
            "omnivoice_stage_running", "Requests running in a stage", labels=["stage"]
        )
        batch = GaugeMetricFamily(
            "omnivoice_stage_last_batch_size", "Size of a stage's last batch", labels=["stage"]
        )
        steps = CounterMetricFamily("omnivoice_stage_steps", "Steps a stage has run", labels=["stage"])
        for s in stats.stages:
            queued.add_metric([s.name], s.queued)
            running.add_metric([s.name], s.running)
            batch.add_metric([s.name], s.last_batch_size)
            steps.add_metric([s.name], s.steps)
        active = GaugeMetricFamily("omnivoice_engine_active_requests", "Requests inside the engine")
        active.add_metric([], stats.active_requests)
        yield from (queued, running, batch, steps, active)


class Metrics:
    """All metrics of one app. `in_flight` and `engine_stats` are read at scrape time."""

    def __init__(self, in_flight: Callable[[], int], engine_stats: Callable[[], EngineStats | None]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "omnivoice_requests", "Chat completion requests by outcome", ["status"], registry=r
        )
        for status in STATUSES:
            self.requests.labels(status)  # export zeros so rates work from the first scrape
        Gauge("omnivoice_requests_in_flight", "Admitted requests not yet finished", registry=r).set_function(
            in_flight
        )
        self.ttft = Histogram(
            "omnivoice_time_to_first_token_seconds", "Arrival to first text chunk sent",
            buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.ttfa = Histogram(
            "omnivoice_time_to_first_audio_seconds", "Arrival to first audio chunk sent",
            buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.rtf = Histogram(
            "omnivoice_real_time_factor", "Arrival to last audio chunk sent, over seconds of audio",
            buckets=_RTF_BUCKETS, registry=r,
        )  # fmt: skip
        self.duration = Histogram(
            "omnivoice_request_duration_seconds", "Arrival to end of response",
            buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.prompt_tokens = Counter("omnivoice_prompt_tokens", "Prompt tokens processed", registry=r)
        self.completion_tokens = Counter("omnivoice_completion_tokens", "Text tokens generated", registry=r)
        self.audio_seconds = Counter("omnivoice_audio_seconds", "Seconds of audio generated", registry=r)
        r.register(EngineStatsCollector(engine_stats))

    def start_request(self) -> RequestTimer:
        return RequestTimer(self)

    def count(self, status: str) -> None:
        """Count a request that ended before generation (invalid, rejected, unavailable)."""
        self.requests.labels(status).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestTimer:
    """Latency bookkeeping of one request; call `text()` / `audio()` when chunks are sent."""

    def __init__(self, metrics: Metrics) -> None:
        self._m = metrics
        self.t0 = time.perf_counter()
        self.first_text: float | None = None
        self.first_audio: float | None = None
        self.last_audio: float | None = None
        self.audio_s = 0.0
        self._done = False

    def text(self) -> None:
        if self.first_text is None:
            self.first_text = time.perf_counter() - self.t0
            self._m.ttft.observe(self.first_text)

    def audio(self, seconds: float) -> None:
        self.last_audio = time.perf_counter() - self.t0
        if self.first_audio is None:
            self.first_audio = self.last_audio
            self._m.ttfa.observe(self.first_audio)
        self.audio_s += seconds

    def finish(self, status: str, prompt_tokens: int = 0, completion_tokens: int = 0) -> None:
        """Record the outcome once; later calls are ignored."""
        if self._done:
            return
        self._done = True
        m = self._m
        m.requests.labels(status).inc()
        m.duration.observe(time.perf_counter() - self.t0)
        m.prompt_tokens.inc(prompt_tokens)
        m.completion_tokens.inc(completion_tokens)
        m.audio_seconds.inc(self.audio_s)
        if status == "ok" and self.audio_s > 0 and self.last_audio is not None:
            m.rtf.observe(self.last_audio / self.audio_s)
