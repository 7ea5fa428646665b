"""Stage threads that build their own runners: in turn or side by side, and a build that fails."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from omnivoice.engine.engine import Engine
from omnivoice.engine.pipeline import PipelineStartError
from omnivoice.engine.stage_thread import BuildTurns
from omnivoice.runners.factory import RunnerFactory
from tests.support.engine import audio_of, collect, profile_for, request, tokens_of


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
                time.sleep(0.02 * (n - i))  # later threads would finish first if they ran at once
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
    started, skipped = _run_turns(BuildTurns(3, parallel=False), 3)
    assert started == [0, 1, 2]
    started, skipped = _run_turns(BuildTurns(3, parallel=False), 3, fail=0)
    assert started == [0] and sorted(skipped) == [1, 2]


def test_side_by_side_builds_do_not_wait_for_each_other() -> None:
    started, skipped = _run_turns(BuildTurns(3, parallel=True), 3)
    # every thread is in its build before the first (slowest) one has finished: reversed start order
    assert sorted(started) == [0, 1, 2] and started[0] == 2 and skipped == []


async def test_stages_built_side_by_side_serve_what_stages_built_in_turn_serve(tiny_checkpoint: Path) -> None:
    profile = profile_for(tiny_checkpoint)
    results = []
    for parallel in (False, True):
        stages = profile.stages.model_copy(update={"parallel_build": parallel})
        eng = await Engine.start(profile.model_copy(update={"stages": stages}))
        try:
            reqs = [request(eng, i) for i in range(2)]
            results.append(await asyncio.gather(*(collect(eng, r) for r in reqs)))
            stage_threads = {t.name for t in threading.enumerate() if t.name.startswith("stage-")}
            assert stage_threads == {"stage-thinker-0", "stage-talker-0", "stage-code2wav-0"}
        finally:
            await eng.close()
    for (a_outs, _), (b_outs, _) in zip(*results, strict=True):
        assert tokens_of(a_outs) == tokens_of(b_outs)
        a, b = audio_of(a_outs), audio_of(b_outs)
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * float(np.abs(b).max()))


async def test_a_stage_that_fails_to_build_fails_the_start_with_its_name(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = RunnerFactory.build

    def build(self, name, replica):  # a device out of memory cannot be caused on demand
        if name == "talker":
            raise MemoryError("talker weights do not fit")
        return built(self, name, replica)

    monkeypatch.setattr(RunnerFactory, "build", build)
    with pytest.raises(PipelineStartError, match="talker stage failed to start: MemoryError"):
        await Engine.start(profile_for(tiny_checkpoint))
