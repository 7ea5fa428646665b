"""What a server's `/metrics` says about one benchmark run: scraped before and after it, the
difference is the run's own.

`breakdown` reports the event loop's lag over the run (its histogram's mean, p50, p95 and p99, read
off the bucket counts as Prometheus' `histogram_quantile` does) and, per stage, how its time went:
steps, the share of the run it was stepping, the host (CPU) time per step, the share of its step time
it was runnable but without a CPU and blocked (mostly waiting for the GIL: engine/step_clock.py), the
time it spent taking messages, and its GPU's utilisation at the end; plus the capacity the engine
measured at the start and the end; with a core process, each hop between it and the server
(types.HOPS); the thinker's prompt positions taken from cached conversation prefixes against
those computed, and its audio windows encoded against those taken from speech sent ahead; and the
realtime responses as the server sent them (their first text and audio, and
how long a player would have waited: server/session/delivery.py), the part of the caller's figures
that the server adds before the socket.
"""

from __future__ import annotations

import math
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]
LAG = "omnivoice_event_loop_lag_seconds"
INTAKE = "omnivoice_realtime_intake_lag_seconds"
HOP = "omnivoice_core_hop_seconds"
CHAT = {
    "prepare": "omnivoice_request_prepare_seconds",
    "first_text": "omnivoice_time_to_first_token_seconds",
    "first_audio": "omnivoice_time_to_first_audio_seconds",
}
RESPONSE = "omnivoice_realtime_response_seconds"
PHASES = ("first_text", "first_audio")
UNDERRUN = "omnivoice_realtime_playback_underrun_seconds"
ENGINE_FIRST_AUDIO = "omnivoice_realtime_engine_first_audio_seconds"
FRONT_END = "front_end"  # the label of one front end's samples (server.front_ends > 1)
PROMPT = "omnivoice_stage_prompt_positions_total"
WINDOWS = "omnivoice_stage_audio_windows_total"
STAGE_SECONDS = ("busy", "step_cpu", "step_runnable", "step_blocked", "ingest")


def scrape(base_url: str, api_key: str | None = None) -> Samples | None:
    """Every sample of `base_url`/metrics (name -> {sorted labels: value}); None if it cannot be read
    or is not in Prometheus' text format. A server of several front ends labels each one's own samples
    (`front_end`); they are summed here, as the whole server's."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(f"{base_url.rstrip('/')}/metrics", headers=headers, timeout=30)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    out: Samples = {}
    try:
        for family in text_string_to_metric_families(r.text):
            for s in family.samples:
                labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != FRONT_END))
                series = out.setdefault(s.name, {})
                series[labels] = series.get(labels, 0.0) + s.value if FRONT_END in s.labels else s.value
    except ValueError:  # not Prometheus' text format (another kind of server)
        return None
    return out


def _by_stage(samples: Samples, name: str) -> dict[str, float]:
    return {dict(k).get("stage", "?"): v for k, v in samples.get(name, {}).items()}


def _one(samples: Samples, name: str) -> float | None:
    return samples.get(name, {}).get(())


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The q-quantile of a histogram from its cumulative (upper bound, count) buckets, interpolated
    linearly within the bucket it falls in (the top bucket's lower bound where it is +Inf)."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * ((rank - below) / (count - below) if count > below else 0.0)
        lower, below = bound, count
    return lower


def loop_lag(before: Samples, after: Samples) -> dict[str, float | None]:
    """The event loop's lag over the run, in ms."""
    return histogram_ms(before, after, LAG)


def histogram_ms(
    before: Samples, after: Samples, name: str, labels: tuple[tuple[str, str], ...] = ()
) -> dict[str, float | None]:
    """Histogram `name` (in seconds; the one of `labels`, sorted pairs) over the run: its samples, and
    its mean and quantiles in ms."""

    def mine(key: tuple[tuple[str, str], ...]) -> bool:
        return tuple(kv for kv in key if kv[0] != "le") == labels

    b, a = before.get(f"{name}_bucket", {}), after.get(f"{name}_bucket", {})
    buckets = sorted((float(dict(k)["le"]), v - b.get(k, 0.0)) for k, v in a.items() if mine(k))
    count = after.get(f"{name}_count", {}).get(labels, 0.0) - before.get(f"{name}_count", {}).get(labels, 0.0)
    total = after.get(f"{name}_sum", {}).get(labels, 0.0) - before.get(f"{name}_sum", {}).get(labels, 0.0)
    out: dict[str, float | None] = {"samples": count, "mean_ms": 1e3 * total / count if count else None}
    for q in (50, 95, 99):
        value = quantile(q / 100, buckets)
        out[f"p{q}_ms"] = None if value is None else 1e3 * value
    return out


def increase(before: float, after: float) -> float:
    """A counter's increase between two scrapes. One that went down was reset in between (its stage
    process was started again): its increase is what it counted since, as Prometheus' `increase`
    takes it, so what it had counted before the reset is left out."""
    return after - before if after >= before else after


def stage_breakdown(before: Samples, after: Samples, seconds: float) -> dict[str, dict[str, float | None]]:
    """Per stage, what its time went to over the run (`seconds` long)."""

    def delta(name: str) -> dict[str, float]:
        b, a = _by_stage(before, name), _by_stage(after, name)
        return {stage: increase(b.get(stage, 0.0), v) for stage, v in a.items()}

    steps = delta("omnivoice_stage_steps_total")
    spent = {key: delta(f"omnivoice_stage_{key}_seconds_total") for key in STAGE_SECONDS}
    ingested = delta("omnivoice_stage_ingested_messages_total")
    gpu_busy = delta("omnivoice_stage_gpu_busy_seconds_total")
    out: dict[str, dict[str, float | None]] = {}
    for stage, n in steps.items():
        busy = spent["busy"].get(stage, 0.0)
        out[stage] = {
            "steps": n,
            "busy_share": busy / seconds if seconds > 0 else None,
            "step_ms": 1e3 * busy / n if n else None,
            "host_ms_per_step": 1e3 * spent["step_cpu"].get(stage, 0.0) / n if n else None,
            "runnable_share_of_step": spent["step_runnable"].get(stage, 0.0) / busy if busy else None,
            "blocked_share_of_step": spent["step_blocked"].get(stage, 0.0) / busy if busy else None,
            "ingest_share": spent["ingest"].get(stage, 0.0) / seconds if seconds > 0 else None,
            "messages": ingested.get(stage, 0.0),
            # the run's mean, from the busy-seconds counter (None: no GPU figure)
            "gpu_utilization_percent": (
                100.0 * gpu_busy[stage] / seconds if stage in gpu_busy and seconds > 0 else None
            ),
        }
    return out


def breakdown(before: Samples | None, after: Samples | None, seconds: float) -> dict[str, Any] | None:
    """The run's figures from the scrapes around it; None if either is missing."""
    if before is None or after is None:
        return None
    return {
        "event_loop_lag": loop_lag(before, after),
        "stages": stage_breakdown(before, after, seconds),
        "capacity_streams": {
            "before": _one(before, "omnivoice_engine_capacity_streams"),
            "after": _one(after, "omnivoice_engine_capacity_streams"),
        },
        "front_door": front_door(before, after, seconds),
        # how far behind its caller each session handled its audio (the backlog after each append)
        "intake_lag": histogram_ms(before, after, INTAKE),
        # a core process's hops (types.HOPS); empty for an in-process engine
        "core_hops": {
            hop: histogram_ms(before, after, HOP, (("hop", hop),))
            for hop in sorted({dict(k)["hop"] for k in after.get(f"{HOP}_count", {})})
        },
        "server_process_cores": _rate(before, after, "process_cpu_seconds_total", seconds),
        # the thinker's prompt positions (from conversations' cached prefixes or computed) and audio
        # windows (encoded, or taken from the speech sent ahead) over the run
        "thinker_prompt": sourced(before, after, PROMPT),
        "thinker_audio_windows": sourced(before, after, WINDOWS),
        # chat requests as the server saw them: from arrival to the engine, to the first text and audio
        "chat": {key: histogram_ms(before, after, name) for key, name in CHAT.items()},
        # realtime responses as the server sent them: from the turn's end to the first text and audio
        # delta queued, and the seconds a player would have waited (session/delivery.py)
        "realtime": {
            **{p: histogram_ms(before, after, RESPONSE, (("phase", p),)) for p in PHASES},
            "underrun": histogram_ms(before, after, UNDERRUN),
        },
        # where those responses' engine requests spent their time to the first audio (types.FirstAudio)
        "engine_first_audio": {
            part: histogram_ms(before, after, ENGINE_FIRST_AUDIO, (("part", part),))
            for part in dict.fromkeys(dict(k)["part"] for k in after.get(f"{ENGINE_FIRST_AUDIO}_count", {}))
        },
    }


def sourced(before: Samples, after: Samples, name: str) -> dict[str, float]:
    """The thinker's counter `name` over the run, by its `source` label (empty: not exported)."""
    out: dict[str, float] = {}
    for key, value in after.get(name, {}).items():
        labels = dict(key)
        if labels.get("stage") == "thinker" and "source" in labels:
            out[labels["source"]] = increase(before.get(name, {}).get(key, 0.0), value)
    return out


def _delta(before: Samples, after: Samples, name: str) -> float | None:
    """Unlabelled sample `name`'s change over the run; None if either scrape lacks it."""
    a, b = _one(after, name), _one(before, name)
    return None if a is None or b is None else a - b


def _rate(before: Samples, after: Samples, name: str, seconds: float) -> float | None:
    change = _delta(before, after, name)
    return None if change is None or seconds <= 0 else change / seconds


def front_door(before: Samples, after: Samples, seconds: float) -> dict[str, float | None]:
    """The front door's work over the run: appends scored, the mean batch, the share of the run its
    workers were busy (summed over workers) and how long an append waited for a worker."""

    ticks, appends, busy, wait = (
        _delta(before, after, f"omnivoice_front_door_{k}_total")
        for k in ("ticks", "appends", "busy_seconds", "wait_seconds")
    )
    return {
        "appends": appends,
        "mean_batch": appends / ticks if appends is not None and ticks else None,
        "busy_share": busy / seconds if busy is not None and seconds > 0 else None,
        "wait_ms_per_append": 1000 * wait / appends if wait is not None and appends else None,
    }


def format_lines(b: dict[str, Any]) -> list[str]:
    """A few table lines of a breakdown."""

    def f(x: float | None, scale: float = 1.0, digits: int = 0) -> str:
        return "-" if x is None else f"{x * scale:.{digits}f}"

    lag, cap = b["event_loop_lag"], b["capacity_streams"]
    lines = [
        f"{'event loop lag ms':<28} mean {f(lag['mean_ms'], digits=1)}, p50 {f(lag['p50_ms'], digits=1)}, "
        f"p95 {f(lag['p95_ms'], digits=1)}, p99 {f(lag['p99_ms'], digits=1)}",
        f"{'capacity streams':<28} {f(cap['before'])} -> {f(cap['after'])}",
    ]
    door = b.get("front_door") or {}
    if door.get("appends"):
        lines.insert(
            2,
            f"{'front door':<28} {f(door['appends'])} appends, batch {f(door['mean_batch'], digits=1)}, "
            f"busy {f(door['busy_share'], 100)} %, wait {f(door['wait_ms_per_append'], digits=1)} ms; "
            f"server process {f(b.get('server_process_cores'), digits=2)} cores",
        )
    intake = b.get("intake_lag") or {}
    if intake.get("samples"):
        lines.insert(
            2,
            f"{'audio intake behind, ms':<28} mean {f(intake['mean_ms'], digits=1)}, "
            f"p50 {f(intake['p50_ms'], digits=1)}, p95 {f(intake['p95_ms'], digits=1)}, "
            f"p99 {f(intake['p99_ms'], digits=1)}",
        )
    prompt, windows = b.get("thinker_prompt") or {}, b.get("thinker_audio_windows") or {}
    if prompt:
        cached, computed = prompt.get("cached", 0.0), prompt.get("computed", 0.0)
        share = cached / (cached + computed) if cached + computed else None
        lines.append(
            f"{'thinker prompt positions':<28} {f(cached)} cached, {f(computed)} computed "
            f"({f(share, 100)} % cached); audio windows {f(windows.get('encoded'))} encoded, "
            f"{f(windows.get('ahead'))} taken from speech sent ahead"
        )
    timed = [(f"chat {k}, ms", h) for k, h in (b.get("chat") or {}).items()]
    timed += [(f"server {k}, ms", h) for k, h in (b.get("realtime") or {}).items()]
    timed += [(f"engine {k}, ms", h) for k, h in (b.get("engine_first_audio") or {}).items()]
    timed += [(f"core hop {k}, ms", h) for k, h in (b.get("core_hops") or {}).items()]
    for title, h in timed:
        if h.get("samples"):
            lines.append(
                f"{title:<28} mean {f(h['mean_ms'], digits=2)}, p50 {f(h['p50_ms'], digits=2)}, "
                f"p95 {f(h['p95_ms'], digits=2)}, p99 {f(h['p99_ms'], digits=2)}"
            )
    lines.append("stage        busy %  step ms  host ms  runnable %  blocked %  ingest %  gpu %")
    for name, s in b["stages"].items():
        lines.append(
            f"{name:<12} {f(s['busy_share'], 100):>6} {f(s['step_ms'], digits=1):>8} "
            f"{f(s['host_ms_per_step'], digits=1):>8} {f(s['runnable_share_of_step'], 100):>11} "
            f"{f(s['blocked_share_of_step'], 100):>10} {f(s['ingest_share'], 100, 1):>9} "
            f"{f(s['gpu_utilization_percent']):>6}"
        )
    return lines
