"""The steps of an engine start, their share of the last start's time, and the kept start times."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from omnivoice.engine.start_progress import StartProgress
from omnivoice.engine.start_record import StartRecord
from omnivoice.messages import StartStep


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_first_start_lists_its_steps_without_a_share() -> None:
    clock = Clock()
    progress = StartProgress(clock)
    progress.expect({}, 0.0)
    progress.record(StartStep("engine", 0, "load model"))
    clock.now += 2.0
    progress.record(StartStep("engine", 0, "load model", 2.0))
    progress.record(StartStep("talker", 0, "graphs"))
    clock.now += 1.5
    snap = progress.snapshot()
    assert snap["elapsed_s"] == 3.5
    assert snap["expected_s"] is None and snap["remaining_s"] is None and snap["share_done"] is None
    assert snap["steps"] == [
        {"step": "engine#0 load model", "state": "done", "seconds": 2.0, "expected_s": None},
        {"step": "talker#0 graphs", "state": "running", "seconds": 1.5, "expected_s": None},
    ]
    assert progress.times() == {"engine#0 load model": 2.0}


def test_a_start_with_a_last_start_says_what_remains(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    progress = StartProgress(clock)
    progress.expect({"engine#0 load model": 10.0, "talker#0 graphs": 20.0, "code2wav#0 graphs": 40.0}, 80.0)
    assert progress.snapshot()["remaining_s"] == 80.0 and progress.snapshot()["share_done"] == 0.0
    progress.record(StartStep("engine", 0, "load model"))
    clock.now += 10.0
    with caplog.at_level(logging.INFO, logger="omnivoice.engine.start_progress"):
        progress.record(StartStep("engine", 0, "load model", 10.0))
    assert "engine#0 load model done in 10.0 s (expected 10.0 s)" in caplog.text
    assert "~70 s remain" in caplog.text
    progress.record(StartStep("talker", 0, "graphs"))
    clock.now += 5.0
    snap = progress.snapshot()
    # the steps left: 15 s of the talker's graphs and Code2Wav's 40 s; the last start's total says 65 s
    assert snap["remaining_s"] == 65.0 and snap["share_done"] == pytest.approx(15 / 80, abs=1e-3)
    assert snap["steps"][-1] == {
        "step": "talker#0 graphs",
        "state": "running",
        "seconds": 5.0,
        "expected_s": 20.0,
    }
    clock.now += 60.0  # the talker's graphs far past their 20 s: what a stuck start looks like
    snap = progress.snapshot()
    assert snap["steps"][-1]["seconds"] == 65.0 and snap["steps"][-1]["expected_s"] == 20.0
    assert snap["remaining_s"] == 40.0  # Code2Wav's graphs, not begun
    progress.record(StartStep("talker", 0, "graphs", 65.0))
    progress.record(StartStep("code2wav", 0, "graphs", 1.0))
    assert progress.snapshot()["remaining_s"] == 5.0  # every step done at 75 s: the last start took 80
    clock.now += 10.0
    assert progress.snapshot()["share_done"] == 1.0 and progress.snapshot()["remaining_s"] == 0.0


def test_stage_processes_build_side_by_side_so_their_steps_do_not_add_up() -> None:
    """Each stage worker's steps run one after another, the workers side by side, the engine's own
    steps before and after: the expected start is that path, not the sum of every step."""
    clock = Clock()
    progress = StartProgress(clock)
    last = {
        "engine#0 load model": 2.0,
        "thinker#0 graphs": 30.0,
        "talker#0 graphs": 25.0,
        "talker#0 prefill compile": 20.0,
        "code2wav#0 graphs": 40.0,
        "engine#0 calibration": 4.0,
    }
    progress.expect(last, 0.0)  # no total kept: the path is all there is to go by
    assert progress.snapshot()["expected_s"] == 2.0 + 45.0 + 4.0  # the talker's lane is the longest
    clock.now += 2.0
    progress.record(StartStep("engine", 0, "load model", 2.0))
    for worker, step, took in [("thinker", "graphs", 30.0), ("code2wav", "graphs", 40.0)]:
        progress.record(StartStep(worker, 0, step, took))
    progress.record(StartStep("talker", 0, "graphs", 25.0))
    progress.record(StartStep("talker", 0, "prefill compile"))
    clock.now += 40.0  # 25 s of the talker's graphs, 15 s of its compile
    # the talker's compile has 5 s left, then the calibration's 4 s
    assert progress.snapshot()["remaining_s"] == 9.0


def test_start_times_are_kept_per_key_and_an_unreadable_record_is_not_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = StartRecord(tmp_path, {"model": "a", "torch": "1"})
    assert first.load() == ({}, 0.0)
    first.save({"engine#0 load model": 1.5}, 12.0)
    assert StartRecord(tmp_path, {"model": "a", "torch": "1"}).load() == ({"engine#0 load model": 1.5}, 12.0)
    assert StartRecord(tmp_path, {"model": "a", "torch": "2"}).load() == ({}, 0.0)
    first.path.write_text(json.dumps({"steps": [1, 2]}))
    with caplog.at_level(logging.WARNING):
        assert first.load() == ({}, 0.0)
    assert "unreadable" in caplog.text
