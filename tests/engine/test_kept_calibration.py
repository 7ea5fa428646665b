"""A start reuses the last calibration of the same model, stage settings, torch version and devices
(engine/kept_calibration.py): it skips the burst and knows its capacity before any request. Another
key calibrates again, and so does a kept file that cannot be read, with a warning."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from omnivoice.config import parse_profile
from omnivoice.engine.engine import Engine
from omnivoice.engine.kept_calibration import KeptCalibration
from omnivoice.types import Capacity

pytestmark = pytest.mark.slow

STAGE = {"worker": "thread", "max_seq_len": 1024, "max_batch": 2}


def profile(cache: Path, tiny_checkpoint: Path, **capacity: Any) -> Any:
    # few steps and short chunks: the calibration's bursts stay short on a loaded CPU
    code2wav = {**STAGE, "chunk": {"first_frames": 2, "frames": 4}}
    stages = {
        "thinker": STAGE,
        "talker": STAGE,
        "code2wav": code2wav,
        "capacity": {"calibrate": True, "min_steps": 6, **capacity},
    }
    return parse_profile({"model": {"path": str(tiny_checkpoint), "cache_dir": str(cache)}, "stages": stages})


async def start(p: Any, caplog: pytest.LogCaptureFixture) -> tuple[str, Capacity, int]:
    """Start and close an engine: its kept-calibration log lines, its capacity as `start` returned,
    and the steps its stages had run by then."""
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="omnivoice.engine"):
        engine = await Engine.start(p)
    try:
        capacity = engine.capacity()  # before any request
        steps = sum(s.steps for s in engine.replica_stats())
    finally:
        await engine.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "omnivoice.engine.kept_calibration"]
    return "\n".join(lines), capacity, steps


async def test_a_second_start_reuses_the_calibration_and_knows_its_capacity_at_once(
    tiny_checkpoint: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    p = profile(tmp_path, tiny_checkpoint)
    said, first, steps = await start(p, caplog)
    assert said.startswith("calibrating: no calibration kept for"), said
    assert first.streams is not None and steps > 0
    kept = KeptCalibration.of(p, tiny_checkpoint)
    assert kept.path.parent == tmp_path / "calibrations" and kept.path.exists()

    said, second, steps = await start(p, caplog)
    assert said.startswith("reusing the calibration of"), said
    assert str(kept.path) in said
    assert steps == 0  # no burst ran
    assert second.streams == first.streams and second.stages == first.stages

    # reuse turned off: a calibration, kept again (for a later start with reuse on)
    said, third, steps = await start(profile(tmp_path, tiny_checkpoint, reuse_calibration=False), caplog)
    assert said == "calibrating: stages.capacity.reuse_calibration is off" and steps > 0
    assert third.streams is not None


async def test_the_warm_up_burst_leaves_the_kept_step_times_as_they_were(
    tiny_checkpoint: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The burst's steps are not timed (messages.TimeSteps): a start that reuses a calibration after
    its warm-up burst knows exactly the kept figures, not a mix with the burst's first steps."""
    p = profile(tmp_path, tiny_checkpoint)
    p = p.model_copy(update={"stages": p.stages.model_copy(update={"warm_burst": True})})
    said, _, _ = await start(p, caplog)
    assert said.startswith("calibrating:"), said
    kept = json.loads(KeptCalibration.of(p, tiny_checkpoint).path.read_text())
    expected = {(w["stage"], w["replica"]): tuple(tuple(x) for x in w["step_times"]) for w in kept["workers"]}
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="omnivoice.engine"):
        engine = await Engine.start(p)
    try:
        assert "reusing the calibration of" in caplog.text
        assert sum(s.steps for s in engine.replica_stats()) > 0  # the burst ran
        assert {(w.name, w.replica): w.step_times for w in engine.replica_stats()} == expected
    finally:
        await engine.close()


async def test_another_key_recalibrates_and_so_does_an_unreadable_file(
    tiny_checkpoint: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    p = profile(tmp_path, tiny_checkpoint)
    await start(p, caplog)
    kept = KeptCalibration.of(p, tiny_checkpoint)
    body = json.loads(kept.path.read_text())
    # the same settings measured on another machine's devices
    kept.path.write_text(
        json.dumps({**body, "key": {**body["key"], "devices": {"thinker#0": "NVIDIA H200"}}})
    )
    said, capacity, steps = await start(p, caplog)
    assert said.startswith("calibrating: the calibration of") and said.endswith("was of other devices"), said
    assert steps > 0 and capacity.streams is not None
    assert json.loads(kept.path.read_text())["key"] == body["key"]  # the new figures replace the old

    # other stage settings
    said, _, steps = await start(profile(tmp_path, tiny_checkpoint, headroom=0.7), caplog)
    assert said.endswith("was of other stage settings"), said
    assert steps > 0

    kept.path.write_text('{"key": {"model": "truncated')
    with caplog.at_level(logging.WARNING):
        said, capacity, steps = await start(p, caplog)
    assert f"the kept calibration in {kept.path} is unreadable" in said
    assert any(r.levelno == logging.WARNING and "unreadable" in r.getMessage() for r in caplog.records)
    assert steps > 0 and capacity.streams is not None
    said, _, steps = await start(p, caplog)  # what that start measured is kept and reused
    assert said.startswith("reusing the calibration of") and steps == 0, said
