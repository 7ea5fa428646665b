"""A fresh server's capacity comes from its start-up calibration (engine/calibration.py): over a real
server and the tiny model, /metrics shows a measured capacity, and step times at every calibrated
batch size, before any request; without calibration it shows none until streams have been served.
/metrics also exports the event loop's lag and where each stage's step time went."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from omnivoice.engine.calibration import calibration_sizes
from tests.support.serve import serve_tiny

STAGE = {"worker": "thread", "max_seq_len": 1024, "max_batch": 4}


def scrape(base_url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Every sample of /metrics: name -> {sorted labels: value}."""
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def stages(calibrate: bool) -> dict[str, object]:
    # few steps and short chunks: the calibration's bursts stay short on a loaded CPU
    capacity = {"calibrate": calibrate, "min_steps": 6}
    code2wav = {**STAGE, "chunk": {"first_frames": 2, "frames": 4}}
    return {"thinker": STAGE, "talker": STAGE, "code2wav": code2wav, "capacity": capacity}


@pytest.mark.slow
def test_a_fresh_server_knows_its_capacity_from_its_calibration(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    # a cache folder of its own: no calibration kept by an earlier run stands in for this one's
    model = {"path": str(tiny_checkpoint), "cache_dir": str(tmp_path)}
    with serve_tiny(tiny_checkpoint, stages=stages(True), model=model) as st:
        lifecycle = st.server.config.app.state.lifecycle  # type: ignore[attr-defined]
        assert lifecycle.engine.stats().active_requests == 0
        m = scrape(st.base_url)
        assert "omnivoice_engine_capacity_streams" in m, sorted(m)
        assert m["omnivoice_engine_capacity_streams"][()] >= 0
        per_stage = {dict(k)["stage"]: v for k, v in m["omnivoice_stage_capacity_streams"].items()}
        assert set(per_stage) == {"thinker", "talker", "code2wav"}, per_stage
        widest = max(calibration_sizes(lifecycle.engine.profile.stages))
        for worker in lifecycle.engine.replica_stats():  # each stage timed steps of several sizes
            measured = {b for b, _, n in worker.step_times if n >= 3}
            assert len(measured) >= 2 and max(measured) > widest // 2, (worker.name, worker.step_times)
        # the stages' time, split: every stage stepped, on a CPU for some of it, and took messages
        for name in ("busy", "step_cpu", "ingest"):
            values = {dict(k)["stage"]: v for k, v in m[f"omnivoice_stage_{name}_seconds_total"].items()}
            assert len(values) == 3 and all(v > 0 for v in values.values()), (name, values)
        for labels, busy in m["omnivoice_stage_busy_seconds_total"].items():
            cpu = m["omnivoice_stage_step_cpu_seconds_total"][labels]
            assert cpu <= 1.2 * busy + 0.05, (labels, cpu, busy)  # the stage thread's own CPU time
            assert m["omnivoice_stage_step_blocked_seconds_total"][labels] >= 0
        assert all(v > 0 for v in m["omnivoice_stage_ingested_messages_total"].values())
        assert "omnivoice_stage_gpu_utilization_percent" not in m  # a CPU: no figure
        assert "omnivoice_stage_gpu_busy_seconds_total" not in m
        lag = m["omnivoice_event_loop_lag_seconds_count"][()]
        assert lag > 0
        again = scrape(st.base_url)
        assert again["omnivoice_event_loop_lag_seconds_count"][()] >= lag
        # the server process's own CPU time, which the realtime bench reads beside the stages'
        assert 0 < m["process_cpu_seconds_total"][()] <= again["process_cpu_seconds_total"][()]


@pytest.mark.slow
def test_without_calibration_a_fresh_server_has_no_capacity_figure(tiny_checkpoint: Path) -> None:
    with serve_tiny(tiny_checkpoint, stages=stages(False)) as st:
        m = scrape(st.base_url)
        assert "omnivoice_engine_capacity_streams" not in m
        assert "omnivoice_event_loop_lag_seconds_bucket" in m
