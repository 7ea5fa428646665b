"""The workload of an A/B benchmark: `omnivoice bench` (chat) or `omnivoice bench realtime` run as a
client process against one server, and the figures read back from the JSON report it writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import omnivoice

WORKLOADS = ("chat", "realtime")

SERVER_CPU = "server_cpu_s"  # CPU time of the server's processes during a run, read off /proc
# metric name -> (its title, where it sits in the client's JSON report; empty: measured by the tool)
METRICS: dict[str, dict[str, tuple[str, tuple[str, ...]]]] = {
    "chat": {
        "latency_ms": ("latency (ms)", ("mean_latency_ms",)),
        "ttfp_ms": ("TTFP (ms)", ("mean_ttfp_ms",)),
        "ttft_ms": ("TTFT (ms)", ("mean_ttft_ms",)),
        SERVER_CPU: ("server CPU (s)", ()),
    },
    "realtime": {
        "voice_to_voice_ms": ("voice-to-voice (ms)", ("summary", "voice_to_voice_ms", "mean")),
        "response_ms": ("response (ms)", ("summary", "response_ms", "mean")),
        SERVER_CPU: ("server CPU (s)", ()),
    },
}


def _client_root() -> Path:
    """The directory holding this `omnivoice` package: the client always runs the tool's own code."""
    return Path(omnivoice.__file__).resolve().parent.parent


def client_command(workload: str, base_url: str, out_json: Path, extra: list[str]) -> list[str]:
    """The client's command line: the workload's own options, then where to send and write."""
    mode = ["realtime"] if workload == "realtime" else []
    return [
        sys.executable,
        "-m",
        "omnivoice",
        "bench",
        *mode,
        *extra,
        "--base-url",
        base_url,
        "--output-json",
        str(out_json),
        "--quiet",
    ]


def _dig(report: dict[str, Any], path: tuple[str, ...]) -> float | None:
    node: Any = report
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return float(node) if isinstance(node, int | float) else None


def read_metrics(workload: str, report: dict[str, Any]) -> dict[str, float | None]:
    """The figures an A/B compares, out of one client report (None where the report lacks one)."""
    return {name: _dig(report, path) for name, (_, path) in METRICS[workload].items() if path}


def failed_share(workload: str, report: dict[str, Any]) -> str | None:
    """Why the run does not count (no successful request or turn, or any error), or None."""
    if workload == "chat":
        ok, errors = report.get("requests", 0), report.get("errors", 0)
    else:
        summary = report.get("summary", {})
        ok, errors = summary.get("turns", 0), summary.get("errors", 0)
    if not ok or errors:
        return f"{ok} succeeded, {errors} failed"
    return None


def run_client(
    workload: str, base_url: str, out_json: Path, extra: list[str], log_path: Path, timeout_s: float
) -> dict[str, Any]:
    """Run the workload once against `base_url`; its report, or RuntimeError if it wrote none."""
    cmd = client_command(workload, base_url, out_json, extra)
    root = _client_root()
    with log_path.open("ab") as log:
        done = subprocess.run(
            cmd,
            cwd=root,  # `python -m` looks in its working directory first: never another tree's omnivoice
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            timeout=timeout_s,
            env={**os.environ, "PYTHONPATH": str(root)},
        )
    if not out_json.exists():
        raise RuntimeError(f"the client exited with code {done.returncode} and wrote no report")
    report: dict[str, Any] = json.loads(out_json.read_text())
    return report
