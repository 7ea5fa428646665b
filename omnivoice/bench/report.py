"""A benchmark run as a flat JSON record and as a table for the terminal."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

from omnivoice.bench.metrics import Stats, Summary


def describe_machine() -> str:
    """CPU model and core count, plus the GPUs nvidia-smi lists, e.g. 'AMD EPYC 9654 (2 cores)'."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    text = f"{cpu} ({cores} cores)"
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=name", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout
            gpus = [g.strip() for g in out.splitlines() if g.strip()]
            if gpus:
                text += f", {len(gpus)}x {gpus[0]}"
        except (OSError, subprocess.SubprocessError):
            pass
    return text


def _stats(prefix: str, stats: Stats, digits: int) -> dict[str, float | None]:
    def r(x: float | None) -> float | None:
        return None if x is None else round(x, digits)

    return {f"mean_{prefix}": r(stats.mean), f"p50_{prefix}": r(stats.p50), f"p99_{prefix}": r(stats.p99)}


def build_report(summary: Summary, **meta: Any) -> dict[str, Any]:
    """One flat record. `meta` carries machine, engine, concurrency, command, ... and goes first."""
    report: dict[str, Any] = {
        "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        **meta,
        "requests": summary.requests,
        "errors": summary.errors,
        "duration_s": round(summary.duration_s, 3),
        **_stats("ttft_ms", summary.ttft_ms, 1),
        **_stats("ttfp_ms", summary.ttfp_ms, 1),
        **_stats("rtf", summary.rtf, 3),
        **_stats("latency_ms", summary.latency_ms, 1),
        "audio_s_per_s": round(summary.audio_s_per_s, 3),
        "output_tok_per_s": round(summary.output_tok_per_s, 2),
        "max_stall_ms": None if summary.max_stall_ms is None else round(summary.max_stall_ms, 1),
        "mean_stall_ms": None if summary.mean_stall_ms is None else round(summary.mean_stall_ms, 1),
        "audio_seconds": round(summary.audio_seconds, 3),
        "text_tokens": summary.text_tokens,
        "requests_without_audio": summary.no_audio,
    }
    if summary.prompt_tokens.mean is not None:
        report["mean_prompt_tokens"] = round(summary.prompt_tokens.mean, 1)
    if summary.first_audio_ms is not None:
        report["mean_first_audio_ms"] = {k: round(v, 1) for k, v in summary.first_audio_ms.items()}
    return report


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.3f}" if abs(x) < 10 else f"{x:.1f}"
    return str(x)


_ROWS = (("TTFT (ms)", "ttft_ms"), ("TTFP (ms)", "ttfp_ms"), ("RTF", "rtf"), ("latency (ms)", "latency_ms"))


def format_table(report: dict[str, Any]) -> str:
    """The run's figures as aligned text: a header block, then mean / p50 / p99 rows."""
    head = [
        ("engine", report.get("engine")),
        ("machine", report.get("machine")),
        ("model", report.get("model")),
        ("concurrency", report.get("concurrency")),
        ("requests ok / errors", f"{report['requests']} / {report['errors']}"),
        ("prompt tokens, mean", report.get("mean_prompt_tokens")),
        ("duration (s)", report["duration_s"]),
        ("audio s per s", report["audio_s_per_s"]),
        ("output tok/s", report["output_tok_per_s"]),
        ("max / mean stall (ms)", f"{_fmt(report['max_stall_ms'])} / {_fmt(report['mean_stall_ms'])}"),
    ]
    width = max(len(k) for k, _ in head)
    lines = [f"{k:<{width}}  {_fmt(v)}" for k, v in head]
    lines.append("")
    lines.append(f"{'':<14}{'mean':>10}{'p50':>10}{'p99':>10}")
    for title, key in _ROWS:
        cells = "".join(f"{_fmt(report[f'{s}_{key}']):>10}" for s in ("mean", "p50", "p99"))
        lines.append(f"{title:<14}{cells}")
    parts = report.get("mean_first_audio_ms")
    if parts:
        lines.append("")
        lines.append(
            "to first audio, mean ms: "
            + ", ".join(f"{k.removesuffix('_ms')} {v:.0f}" for k, v in parts.items())
        )
    return "\n".join(lines)


def write_json(report: dict[str, Any], path: str | Path) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(report, indent=2) + "\n")
