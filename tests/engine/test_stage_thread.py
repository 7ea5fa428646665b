"""Stage threads that build their own runners in turn, and a build that fails."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from omnivoice.engine.engine import Engine
from omnivoice.engine.pipeline import PipelineStartError
from omnivoice.engine.stage_thread import BuildTurns
from omnivoice.runners.factory import RunnerFactory
from tests.support.engine import profile_for


def _run_turns(turns: BuildTurns, n: int, fail: int | None = None) -> tuple[list[int], list[int]]:
    """n threads take their turns; each records when it starts and ends building (or skips)."""
    started: list[int] = []
    skipped: list[int] = []
    lock = threading.Lock()

    def build(i: int) -> None:
        try:
            with turns.turn(i) as go:
                if not go:
                    with lock:
                        skipped.append(i)
                    return
                with lock:
                    started.append(i)
                time.sleep(0.02 * (n - i))  # later threads would finish first if they did not wait
                if i == fail:
                    raise RuntimeError("no room")
        except RuntimeError:
            pass

    threads = [threading.Thread(target=build, args=(i,)) for i in reversed(range(n))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    return started, skipped


def test_builds_in_turn_run_in_order_and_stop_after_a_failure() -> None:
    started, skipped = _run_turns(BuildTurns(3), 3)
    assert started == [0, 1, 2]
    started, skipped = _run_turns(BuildTurns(3), 3, fail=0)
    assert started == [0] and sorted(skipped) == [1, 2]


async def test_a_stage_that_fails_to_build_fails_the_start_with_its_name(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = RunnerFactory.build

    def build(self, name, replica, report=None):  # a device out of memory cannot be caused on demand
        if name == "talker":
            raise MemoryError("talker weights do not fit")
        return built(self, name, replica, report)

    monkeypatch.setattr(RunnerFactory, "build", build)
    with pytest.raises(PipelineStartError, match="talker stage failed to start: MemoryError"):
        await Engine.start(profile_for(tiny_checkpoint))
