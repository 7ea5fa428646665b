"""The server's state during a soak, read from `GET /v1/debug/state` (loopback only): compact samples,
waiting until it is quiet again, and what is left over at the end compared with the baseline.

A sample is a flat dict: the counts that must drain to 0 once no client is connected (`MUST_DRAIN`),
the tombstones (aborted ids the stage workers remember for a while), and per process ("server",
"thinker-0", ...) its pid, resident memory and open fds.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

MUST_DRAIN = (
    "sessions",  # realtime sessions of every transport
    "reserved_slots",
    "requests_in_flight",  # admitted chat requests and realtime responses
    "engine_requests",  # the engine's own request table
    "stage_requests",  # every stage worker's per-request tables (queued, running, routes)
    "routed",  # requests the router counts against a replica
    "conversations",  # conversations the router remembers
    "prefixes",  # cached conversation prefixes in the thinker
    "kv_slots_used",
)


async def fetch_state(client: httpx.AsyncClient, base_url: str) -> dict[str, Any]:
    r = await client.get(f"{base_url}/v1/debug/state", timeout=30)
    r.raise_for_status()
    return r.json()


async def wait_healthy(client: httpx.AsyncClient, base_url: str, timeout_s: float) -> None:
    """Wait until /health says the engine is up (a server just started may still be loading)."""
    deadline = time.monotonic() + timeout_s
    while (await client.get(f"{base_url}/health", timeout=30)).status_code != 200:
        if time.monotonic() > deadline:
            raise httpx.TimeoutException(f"{base_url}/health not 200 after {timeout_s:.0f} s")
        await asyncio.sleep(1.0)


def compact(state: dict[str, Any], t: float) -> dict[str, Any]:
    """One sample at `t` seconds into the run."""
    rt, proc, engine = state["realtime"], state["process"], state["engine"] or {}
    workers = engine.get("workers", [])
    sample: dict[str, Any] = {
        "t": round(t, 1),
        "sessions": rt["sessions"],
        "reserved_slots": rt["reserved_slots"],
        "webrtc_calls": rt["webrtc_calls"],
        "twilio_calls": rt["twilio_calls"],
        "requests_in_flight": state["requests_in_flight"],
        "engine_requests": engine.get("active_requests", 0),
        "stage_requests": engine.get("live_requests", 0),
        "routed": engine.get("routed", 0),
        "conversations": engine.get("conversations", 0),
        "prefixes": sum(w["prefixes"] for w in workers),
        "kv_slots_used": sum(w["kv_slots_used"] for w in workers),
        "tombstones": sum(w["tombstones"] for w in workers),
        "asyncio_tasks": proc["asyncio_tasks"],
        "shm_segments": proc["shm_segments"],
        "processes": {"server": _proc(proc["pid"], proc["rss_bytes"], proc["open_fds"])},
    }
    for w in workers:
        if w["pid"] and w["pid"] != proc["pid"]:  # a stage process (thread workers live in the server)
            sample["processes"][f"{w['name']}-{w['replica']}"] = _proc(
                w["pid"], w["rss_bytes"], w["open_fds"]
            )
    return sample


def _proc(pid: int, rss: int, fds: int) -> dict[str, Any]:
    return {"pid": pid, "rss_mb": round(rss / 2**20, 1), "fds": fds}


def busy(sample: dict[str, Any]) -> dict[str, int]:
    """The counts that have not drained yet."""
    return {k: sample[k] for k in MUST_DRAIN if sample[k]}


async def wait_quiet(
    client: httpx.AsyncClient, base_url: str, t0: float, timeout_s: float, baseline_shm: int = 0
) -> tuple[dict[str, Any], float]:
    """Poll until nothing is in flight (and the shm segments are back to the baseline), or until
    `timeout_s`; returns the last sample and the seconds it took."""
    start = time.monotonic()
    while True:
        sample = compact(await fetch_state(client, base_url), time.monotonic() - t0)
        quiet = not busy(sample) and sample["shm_segments"] <= baseline_shm
        waited = time.monotonic() - start
        if quiet or waited >= timeout_s:
            return sample, waited
        await asyncio.sleep(0.25)


def leaks(
    baseline: dict[str, Any], end: dict[str, Any], fd_tolerance: int, task_tolerance: int
) -> dict[str, Any]:
    """What the server still holds at `end` that it did not at `baseline` ({} when nothing leaked)."""
    found: dict[str, Any] = dict(busy(end))
    if end["shm_segments"] > baseline["shm_segments"]:
        found["shm_segments"] = end["shm_segments"] - baseline["shm_segments"]
    if end["asyncio_tasks"] > baseline["asyncio_tasks"] + task_tolerance:
        found["asyncio_tasks"] = end["asyncio_tasks"] - baseline["asyncio_tasks"]
    for name, before in baseline["processes"].items():
        after = end["processes"].get(name)
        if after is None or after["pid"] != before["pid"]:
            found[f"{name}: process replaced"] = after["pid"] if after else None
        elif after["fds"] > before["fds"] + fd_tolerance:
            found[f"{name}: open fds"] = after["fds"] - before["fds"]
    return found


def memory(samples: list[dict[str, Any]], baseline: dict[str, Any], end: dict[str, Any]) -> dict[str, Any]:
    """Per process: resident MB at the baseline, at the end and at its peak; fds at both ends."""
    out: dict[str, Any] = {}
    for name, before in baseline["processes"].items():
        after = end["processes"].get(name, before)
        peak = max((s["processes"][name]["rss_mb"] for s in samples if name in s["processes"]), default=0.0)
        out[name] = {
            "rss_start_mb": before["rss_mb"],
            "rss_end_mb": after["rss_mb"],
            "rss_peak_mb": max(peak, before["rss_mb"], after["rss_mb"]),
            "rss_growth_mb": round(after["rss_mb"] - before["rss_mb"], 1),
            "fds_start": before["fds"],
            "fds_end": after["fds"],
        }
    return out
