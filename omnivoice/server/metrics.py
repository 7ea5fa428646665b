"""Prometheus metrics of one app: request latencies, throughput, and the engine's stage gauges.

Each `Metrics` owns its `CollectorRegistry`, so several apps (tests) never share counters.
Latencies follow vLLM-Omni's benchmark definitions, measured server-side from the moment the
request arrived: TTFT to the first text sent, time to first audio sent, and RTF = time of the
last audio chunk sent / seconds of audio produced.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from omnivoice.server.loop_lag import LoopLag
from omnivoice.types import Capacity, EngineStats, SecondsHistogram, StageStats

_LATENCY_BUCKETS = (0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)
_PREPARE_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
_RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)

# Values of the `status` label of omnivoice_requests_total.
STATUSES = ("ok", "cancelled", "error", "invalid", "rejected", "unavailable")


T = TypeVar("T")


class ScrapedCollector(Collector, Generic[T]):
    """Exports what its `collect` reads off `source` at scrape time; nothing is known to describe
    before that."""

    def __init__(self, source: T) -> None:
        self._source = source

    def describe(self) -> list[Metric]:
        return []


def histogram_family(
    name: str, doc: str, bounds: tuple[float, ...], counts: list[int], total: int, sum_s: float
) -> HistogramMetricFamily:
    """A histogram kept as cumulative `counts` per upper bound in `bounds` (plus `total` and its
    `sum_s`), as Prometheus reads one."""
    family = HistogramMetricFamily(name, doc)
    add_histogram(family, [], bounds, counts, total, sum_s)
    return family


def add_histogram(
    family: HistogramMetricFamily,
    labels: list[str],
    bounds: tuple[float, ...],
    counts: list[int],
    total: int,
    sum_s: float,
) -> None:
    """Add to `family` the series of `labels`: cumulative `counts` per bound, `total` and `sum_s`."""
    buckets = [(f"{bound:g}", float(n)) for bound, n in zip(bounds, counts, strict=True)]
    family.add_metric(labels, [*buckets, ("+Inf", float(total))], sum_s)


def seconds_family(
    name: str, doc: str, label: str, hists: Iterable[SecondsHistogram]
) -> HistogramMetricFamily:
    """One histogram family of `hists`, each the series whose `label` is its name."""
    family = HistogramMetricFamily(name, doc, labels=[label])
    for h in hists:
        add_histogram(family, [h.name], h.bounds, h.counts, h.total, h.sum_s)
    return family


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
        gave_way = CounterMetricFamily(
            "omnivoice_stage_gave_way_seconds",
            "Time a stage waited, its work all ahead of playback, for first or dry audio on its device",
            labels=["stage"],
        )
        prompt = CounterMetricFamily(
            "omnivoice_stage_prompt_positions",
            "Prompt positions a stage took from its conversations' cached prefixes (source=cached) or "
            "computed in its prefills (source=computed)",
            labels=["stage", "source"],
        )
        windows = CounterMetricFamily(
            "omnivoice_stage_audio_windows",
            "Audio-encoder windows of requests' audio: encoded by the stage (source=encoded, windows sent "
            "ahead included) or taken encoded from the speech sent ahead while it was spoken (source=ahead)",
            labels=["stage", "source"],
        )
        for s in stats.stages:
            if s.name == "thinker":
                prompt.add_metric([s.name, "cached"], s.cached_tokens)
                prompt.add_metric([s.name, "computed"], s.prefilled_tokens)
                windows.add_metric([s.name, "encoded"], s.audio_windows)
                windows.add_metric([s.name, "ahead"], s.audio_windows_ahead)
            queued.add_metric([s.name], s.queued)
            running.add_metric([s.name], s.running)
            batch.add_metric([s.name], s.last_batch_size)
            steps.add_metric([s.name], s.steps)
            gave_way.add_metric([s.name], s.gave_way_s)
        active = _gauge(
            "omnivoice_engine_active_requests", "Requests inside the engine", stats.active_requests
        )
        yield from (queued, running, batch, steps, gave_way, active, prompt, windows)
        yield from _stage_time_metrics(stats.stages)
        if stats.hops:
            yield _hop_metrics(stats.hops)
        if stats.capacity is not None:
            yield from _capacity_metrics(stats.capacity)
        if stats.narrowed is not None:
            yield _gauge(
                "omnivoice_engine_narrowed_requests",
                "Requests the engine serves at once because its start found GPU memory for no wider batch",
                stats.narrowed,
            )


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    """A gauge of one unlabelled value."""
    family = GaugeMetricFamily(name, doc)
    family.add_metric([], value)
    return family


def _stage_time_metrics(stages: tuple[StageStats, ...]) -> Iterator[Metric]:
    """Where each stage's time goes (engine/step_clock.py): its steps' wall time split into on a CPU,
    runnable waiting for a CPU and blocked (mostly waiting for the GIL), its time taking messages,
    and its device's utilisation."""
    counters = (
        ("busy", "Wall time a stage spent in its steps"),
        ("step_cpu", "Time a stage's thread was on a CPU during its steps (host time)"),
        ("step_runnable", "Time a stage's thread was runnable but waiting for a CPU during its steps"),
        ("step_blocked", "Time a stage's thread was blocked during its steps: mostly waiting for the GIL"),
        ("ingest", "Wall time a stage spent taking incoming messages"),
    )
    families = [CounterMetricFamily(f"omnivoice_stage_{k}_seconds", d, labels=["stage"]) for k, d in counters]
    ingested = CounterMetricFamily(
        "omnivoice_stage_ingested_messages", "Messages a stage has taken from its inbox", labels=["stage"]
    )
    gpu = GaugeMetricFamily(
        "omnivoice_stage_gpu_utilization_percent", "Utilisation of a stage's GPU (NVML)", labels=["stage"]
    )
    gpu_busy = CounterMetricFamily(
        "omnivoice_stage_gpu_busy_seconds",
        "Time a kernel ran on a stage's GPU: its NVML utilisation integrated over time (a stage of several "
        "replicas: its busiest replica's GPU)",
        labels=["stage"],
    )
    for s in stages:
        blocked = max(0.0, s.busy_s - s.step_cpu_s - s.step_runnable_s)
        values = (s.busy_s, s.step_cpu_s, s.step_runnable_s, blocked, s.ingest_s)
        for family, value in zip(families, values, strict=True):
            family.add_metric([s.name], value)
        ingested.add_metric([s.name], s.ingested)
        if s.gpu_utilization is not None:
            gpu.add_metric([s.name], s.gpu_utilization)
        if s.gpu_busy_s is not None:
            gpu_busy.add_metric([s.name], s.gpu_busy_s)
    yield from (*families, ingested, gpu, gpu_busy)


def _hop_metrics(hops: tuple[SecondsHistogram, ...]) -> HistogramMetricFamily:
    """How long messages take between the engine client and its core process, hop by hop (types.HOPS)."""
    return seconds_family(
        "omnivoice_core_hop_seconds",
        "Time of a message between the engine client and its core process, by hop: request (client to "
        "the core's main thread), outbox (dispatcher to the channel), channel (until read in the "
        "server), loop (from being read to the requests: a reader thread's hand-over to the event loop)",
        "hop",
        hops,
    )


def _capacity_metrics(cap: Capacity) -> Iterator[Metric]:
    """The measured capacity (engine/capacity.py); a figure not measured yet is left out."""
    yield _gauge(
        "omnivoice_engine_audio_streams",
        "Requests with audio inside the engine (streams in flight)",
        cap.active_streams,
    )
    if cap.streams is not None:
        yield _gauge(
            "omnivoice_engine_capacity_streams",
            "Audio streams the engine measures it can serve in real time",
            cap.streams,
        )
    per_stage = GaugeMetricFamily(
        "omnivoice_stage_capacity_streams",
        "Audio streams a stage measures it can serve in real time (its replicas together)",
        labels=["stage"],
    )
    for name, n in cap.stages:
        if n is not None:
            per_stage.add_metric([name], n)
    yield per_stage
    if cap.worst_slack_s is not None:
        yield _gauge(
            "omnivoice_engine_worst_slack_seconds",
            "Least audio ahead of real time among the streams playing (below 0: run dry)",
            cap.worst_slack_s,
        )


class ServerStateCollector(Collector):
    """Reads the server's state (`debug_state.snapshot`) at scrape time: open sessions by transport,
    each stage worker's request tables, and the processes' memory, fds and shared-memory segments."""

    def __init__(self, get_state: Callable[[], dict[str, Any]]) -> None:
        self._get_state = get_state

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        state = self._get_state()
        rt = state["realtime"]
        sessions = GaugeMetricFamily(
            "omnivoice_realtime_sessions", "Open realtime sessions by transport", labels=["transport"]
        )
        transports = (("websocket", "websocket"), ("webrtc", "webrtc_calls"), ("twilio", "twilio_calls"))
        for transport, key in transports:
            sessions.add_metric([transport], rt[key])
        slots = _gauge(
            "omnivoice_realtime_reserved_slots", "Realtime session slots held", rt["reserved_slots"]
        )
        proc = state["process"]
        rss = GaugeMetricFamily(
            "omnivoice_process_resident_memory_bytes", "Resident memory by process", labels=["process"]
        )
        fds = GaugeMetricFamily(
            "omnivoice_process_open_fds", "Open file descriptors by process", labels=["process"]
        )
        rss.add_metric(["server"], proc["rss_bytes"])
        fds.add_metric(["server"], proc["open_fds"])
        yield from _speculative(state["speculative_responses"])
        tasks = _gauge(
            "omnivoice_asyncio_tasks", "asyncio tasks of the server's event loop", proc["asyncio_tasks"]
        )
        shm = _gauge(
            "omnivoice_shm_segments",
            "Shared-memory segments of the server's connectors",
            proc["shm_segments"],
        )
        yield from (sessions, slots, tasks, shm)
        engine = state["engine"]
        if engine is not None:
            tables = GaugeMetricFamily(
                "omnivoice_stage_requests",
                "Entries of a stage worker's per-request tables (tombstones: recently aborted ids)",
                labels=["stage", "replica", "table"],
            )
            graphs = GaugeMetricFamily(
                "omnivoice_stage_graphs_pending",
                "CUDA graphs of wide batches a stage worker still captures after the start, while idle",
                labels=["stage", "replica"],
            )
            mps = GaugeMetricFamily(
                "omnivoice_stage_mps_client",
                "1 when a stage worker is a GPU process started as a client of an MPS daemon",
                labels=["stage", "replica"],
            )
            for w in engine["workers"]:
                stage, replica = w["name"], str(w["replica"])
                mps.add_metric([stage, replica], 1.0 if w["mps_client"] else 0.0)
                for table in ("queued", "running", "routes", "tombstones", "prefixes", "kv_slots_used"):
                    tables.add_metric([stage, replica, table], w[table])
                graphs.add_metric([stage, replica], w["graphs_pending"])
                if w["pid"] and w["pid"] != proc["pid"]:  # a process of its own
                    rss.add_metric([f"{stage}-{replica}"], w["rss_bytes"])
                    fds.add_metric([f"{stage}-{replica}"], w["open_fds"])
            conversations = _gauge(
                "omnivoice_engine_conversations",
                "Conversations the engine routes to a thinker replica",
                engine["conversations"],
            )
            yield from (tables, graphs, mps, conversations)
        yield from (rss, fds)


def _speculative(counts: dict[str, float]) -> Iterator[Metric]:
    """Server VAD's speculative responses (session/speculation.py): started when the speech paused,
    then confirmed as the turn's response or dropped, and what the dropped ones had generated."""
    described = (
        ("started", "Speculative responses started when a caller's speech paused"),
        ("confirmed", "Speculative responses that became their turn's response"),
        ("dropped", "Speculative responses aborted before their turn was confirmed"),
        ("wasted_tokens", "Text tokens generated by dropped speculative responses"),
        ("wasted_audio_seconds", "Seconds of audio generated by dropped speculative responses"),
    )
    for key, doc in described:
        family = CounterMetricFamily(f"omnivoice_realtime_speculative_{key}", doc)
        family.add_metric([], counts[key])
        yield family


class Metrics:
    """All metrics of one app. `in_flight`, `engine_stats` and `server_state` are read at scrape time."""

    def __init__(
        self,
        in_flight: Callable[[], int],
        engine_stats: Callable[[], EngineStats | None],
        server_state: Callable[[], dict[str, Any]] | None = None,
        promised_streams: Callable[[], int] | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # the server process's own CPU seconds and memory (process_cpu_seconds_total, ...): with the
        # stage processes' step CPU, what the front end costs next to the engine
        ProcessCollector(registry=r)
        self.requests = Counter(
            "omnivoice_requests", "Chat completion requests by outcome", ["status"], registry=r
        )
        for status in STATUSES:
            self.requests.labels(status)  # export zeros so rates work from the first scrape
        Gauge("omnivoice_requests_in_flight", "Admitted requests not yet finished", registry=r).set_function(
            in_flight
        )
        if promised_streams is not None:
            Gauge(
                "omnivoice_admitted_streams",
                "Audio streams admitted: open realtime sessions and chat requests with audio",
                registry=r,
            ).set_function(promised_streams)
        self.prepare = Histogram(
            "omnivoice_request_prepare_seconds",
            "Arrival to the request handed to the engine: its body read, validated and tokenized",
            buckets=_PREPARE_BUCKETS, registry=r,
        )  # fmt: skip
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
        self.loop_lag = LoopLag(r)  # sampled while the app runs (its lifespan starts and stops it)
        r.register(EngineStatsCollector(engine_stats))
        if server_state is not None:
            r.register(ServerStateCollector(server_state))

    def start_request(self, arrived: float | None = None) -> RequestTimer:
        """A request's timer, its times counted from `arrived` (time.perf_counter(); None: now)."""
        return RequestTimer(self, arrived)

    def count(self, status: str) -> None:
        """Count a request that ended before generation (invalid, rejected, unavailable)."""
        self.requests.labels(status).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestTimer:
    """Latency bookkeeping of one request; call `text()` / `audio()` when chunks are sent."""

    def __init__(self, metrics: Metrics, t0: float | None = None) -> None:
        self._m = metrics
        self.t0 = time.perf_counter() if t0 is None else t0
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
