"""The soak's report: what the callers did, latency and memory per time window (drift), and the
server's state at the baseline and at the end; as a dict (JSON) and as a table for the terminal."""

from __future__ import annotations

from typing import Any

from omnivoice.bench import server_probe as probe
from omnivoice.bench.metrics import percentile
from omnivoice.bench.soak_caller import SoakTally


def _stats(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "mean": None, "p50": None, "p95": None}
    ms = [1000 * v for v in values]
    return {
        "n": len(ms),
        "mean": round(sum(ms) / len(ms), 1),
        "p50": round(percentile(ms, 50), 1),
        "p95": round(percentile(ms, 95), 1),
    }


def windows(tally: SoakTally, samples: list[dict[str, Any]], load_s: float, window_s: float) -> list[dict]:
    """The load split into equal windows of about `window_s`: answers' latency, the server's memory."""
    count = max(1, round(load_s / window_s))
    width = load_s / count
    rows = []
    for i in range(count):
        lo, hi = i * width, (i + 1) * width
        lat = [(v, r) for t, v, r in tally.latencies if lo <= t < hi or (i == count - 1 and t >= hi)]
        inside = [s for s in samples if lo <= s["t"] < hi]
        stage_rss = [sum(p["rss_mb"] for n, p in s["processes"].items() if n != "server") for s in inside]
        rows.append(
            {
                "start_s": round(lo, 1),
                "end_s": round(hi, 1),
                "voice_to_voice_ms": _stats([v for v, _ in lat]),
                "response_ms": _stats([r for _, r in lat if r is not None]),
                "server_rss_mb": _mean([s["processes"]["server"]["rss_mb"] for s in inside]),
                "stage_rss_mb": _mean(stage_rss),
                "server_sessions_max": max((s["sessions"] for s in inside), default=None),
            }
        )
    return rows


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 1) if values else None


def growth(samples: list[dict[str, Any]], warmup_s: float, load_s: float) -> dict[str, Any]:
    """Per process: resident memory against sessions opened, over the load samples after `warmup_s`
    (allocator pools and caches fill during the warm-up). `kb_per_session` is the least-squares slope:
    what a leak costs per session; a flat process is near 0."""
    out: dict[str, Any] = {}
    after = [s for s in samples if warmup_s <= s["t"] <= load_s]
    for name in samples[0]["processes"]:
        pts = [
            (s["sessions_opened"], s["processes"][name]["rss_mb"]) for s in after if name in s["processes"]
        ]
        sessions = pts[-1][0] - pts[0][0] if pts else 0
        slope = None
        if sessions > 0:
            mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
            sxx = sum((x - mx) ** 2 for x, _ in pts)
            slope = round(1024 * sum((x - mx) * (y - my) for x, y in pts) / sxx, 1)
        out[name] = {
            "warmup_s": round(warmup_s, 1),
            "sessions_after_warmup": sessions,
            "rss_after_warmup_mb": pts[0][1] if pts else None,
            "rss_load_end_mb": pts[-1][1] if pts else None,
            "kb_per_session": slope,
        }
    return out


def summarize(
    tally: SoakTally,
    samples: list[dict[str, Any]],
    baseline: dict[str, Any],
    end: dict[str, Any],
    load_s: float,
    settle_s: float,
    window_s: float,
) -> dict[str, Any]:
    rows = windows(tally, samples, load_s, window_s)
    with_data = [w for w in rows if w["voice_to_voice_ms"]["n"]]
    drift = None
    if len(with_data) >= 2:
        drift = round(with_data[-1]["voice_to_voice_ms"]["p50"] - with_data[0]["voice_to_voice_ms"]["p50"], 1)
    return {
        "load_seconds": round(load_s, 1),
        "settle_seconds": round(settle_s, 1),
        "client": {
            "sessions_opened": tally.sessions_opened,
            "sessions_closed": tally.sessions_closed,
            "peak_sessions_held": tally.peak_held,
            "turns_completed": tally.turns_completed,
            "barge_ins": tally.barge_ins,
            "barge_ins_late": tally.barge_ins_late,
            "abrupt_disconnects": sum(tally.disconnects.values()),
            "abrupt_disconnects_by_phase": dict(sorted(tally.disconnects.items())),
            "abrupt_disconnects_mid_response": tally.disconnects_mid_response,
            "errors": dict(sorted(tally.errors.items())),
            "error_total": sum(tally.errors.values()),
        },
        "latency": {
            "voice_to_voice_ms": _stats([v for _, v, _ in tally.latencies]),
            "response_ms": _stats([r for _, _, r in tally.latencies if r is not None]),
            "drift_p50_ms": drift,
            "windows": rows,
        },
        "server": {
            "peak_sessions": max(s["sessions"] for s in samples),
            "memory": probe.memory(samples, baseline, end),
            "memory_growth": growth(samples, rows[0]["end_s"], load_s),  # after the first window
            "shm_segments": {"start": baseline["shm_segments"], "end": end["shm_segments"]},
            "asyncio_tasks": {"start": baseline["asyncio_tasks"], "end": end["asyncio_tasks"]},
            "tombstones_end": end["tombstones"],
            "baseline": baseline,
            "end": end,
        },
        "samples": samples,
    }


def format_table(report: dict[str, Any]) -> str:
    c, lat, srv = report["client"], report["latency"], report["server"]

    def ms(s: dict[str, Any]) -> str:
        return " / ".join("-" if s[k] is None else f"{s[k]:.0f}" for k in ("mean", "p50", "p95"))

    def row(label: str, value: Any) -> str:
        return f"{label:<34}{value}"

    vv = lat["voice_to_voice_ms"]
    disconnects = f"{c['abrupt_disconnects']} ({c['abrupt_disconnects_mid_response']})"
    lines = [
        f"soak: {report['config']['concurrency']} callers, {report['load_seconds']:.0f} s, "
        + report["machine"],
        row("sessions opened / peak held", f"{c['sessions_opened']} / {c['peak_sessions_held']}"),
        row("server's peak of open sessions", srv["peak_sessions"]),
        row("turns completed", c["turns_completed"]),
        row("barge-ins (late)", f"{c['barge_ins']} ({c['barge_ins_late']})"),
        row("abrupt disconnects (mid-answer)", f"{disconnects} {c['abrupt_disconnects_by_phase']}"),
        row("errors", f"{c['error_total']} {c['errors']}"),
        row("voice-to-voice ms mean/p50/p95", f"{ms(vv)} (n {vv['n']})"),
        row("drift of p50, last - first window", f"{lat['drift_p50_ms']} ms"),
        "window s      answers  v2v p50 / p95 ms  server RSS MB  stage RSS MB",
    ]
    for w in lat["windows"]:
        v = w["voice_to_voice_ms"]
        p = "-" if v["p50"] is None else f"{v['p50']:.0f} / {v['p95']:.0f}"
        lines.append(
            f"{w['start_s']:>5.0f}-{w['end_s']:<6.0f} {v['n']:>8}  {p:>16}  {w['server_rss_mb'] or '-':>13}"
            f"  {w['stage_rss_mb'] or '-':>12}"
        )
    lines.append(
        "process       RSS MB start / end / peak   fds start / end   KB/session after the 1st window"
    )
    for name, m in srv["memory"].items():
        g = srv["memory_growth"][name]
        slope = "-" if g["kb_per_session"] is None else f"{g['kb_per_session']:.1f}"
        n = g["sessions_after_warmup"]
        lines.append(
            f"{name:<13} {m['rss_start_mb']:>7.1f} / {m['rss_end_mb']:.1f} / {m['rss_peak_mb']:.1f}"
            f"       {m['fds_start']:>3} / {m['fds_end']:<5}   {slope} ({n} sessions)"
        )
    lines += [
        row("shm segments start / end", f"{srv['shm_segments']['start']} / {srv['shm_segments']['end']}"),
        row("asyncio tasks start / end", f"{srv['asyncio_tasks']['start']} / {srv['asyncio_tasks']['end']}"),
        row("tombstones at the end", srv["tombstones_end"]),
        row("quiet after", f"{report['settle_seconds']} s"),
        row("LEAKED", report["leaks"]) if report["leaks"] else row("leaks", "none"),
    ]
    return "\n".join(lines)
