"""The capacity model from synthetic step observations: step times by batch size, the line fitted to
them, the largest batch a stage can step within real time, and the engine's figure over its stages."""

from __future__ import annotations

import pytest

from omnivoice.config import CapacityConfig
from omnivoice.engine.capacity import RECENT, StepTimes, carry_step_times, engine_capacity, fit, stage_streams
from omnivoice.types import Capacity, StageStats

CFG = CapacityConfig(headroom=0.8, min_steps=10)
FRAME_S = 0.08  # a talker step's budget: one frame of audio for each request in it


def _times(
    line: tuple[float, float], sizes: list[int], steps: int = 20
) -> tuple[tuple[int, float, int], ...]:
    """What a worker reports after `steps` steps at each of `sizes`, each taking base + per x batch."""
    times = StepTimes()
    for b in sizes:
        for _ in range(steps):
            times.add(b, line[0] + line[1] * b)
    return times.snapshot()


def test_step_times_are_the_median_of_the_latest_steps_per_batch_size() -> None:
    times = StepTimes()
    for t in (0.010, 0.012, 0.300, 0.011):  # 0.300: a step that also prefilled a burst of prompts
        times.add(2, t)
    times.add(0, 5.0)  # a step that ran no request says nothing about batches
    times.add(1, 0.008)
    ((b1, t1, n1), (b2, t2, n2)) = times.snapshot()
    assert (b1, n1, b2, n2) == (1, 1, 2, 4)
    assert t1 == pytest.approx(0.008) and t2 == pytest.approx(0.0115)
    for _ in range(RECENT):  # the stage got slower: only its latest steps count
        times.add(2, 0.020)
    assert times.snapshot()[1] == (2, pytest.approx(0.020), 4 + RECENT)


def test_the_fit_recovers_base_and_per_request_cost() -> None:
    base, per = fit(_times((0.010, 0.005), [1, 2, 4, 8])) or (0, 0)
    assert base == pytest.approx(0.010) and per == pytest.approx(0.005)
    # one batch size seen: a line through the origin, the cautious reading
    assert fit(_times((0.010, 0.005), [2])) == pytest.approx((0.0, 0.010))
    # bigger batches measured faster (noise): never a negative cost per request
    assert fit(((1, 0.02, 50), (4, 0.01, 50))) == pytest.approx((0.015, 0.0))
    assert fit(()) is None
    # a size seen once or twice (a first-time cost, a kernel compiled for its shape) does not count
    assert fit(((1, 0.010, 50), (2, 0.015, 50), (32, 2.0, 1))) == pytest.approx((0.005, 0.005))


def test_a_stage_fits_as_many_requests_as_its_budget_allows() -> None:
    # 10 ms + 5 ms a request against 64 ms (80 ms x 0.8): 10 requests
    assert stage_streams(_times((0.010, 0.005), [1, 2, 4, 8]), FRAME_S, CFG, cap=64) == 10
    # ...but measured up to 4 requests a step only: the line is trusted up to twice that
    assert stage_streams(_times((0.010, 0.005), [1, 2, 4]), FRAME_S, CFG, cap=64) == 8
    # flat on a GPU: the fixed cap bounds it
    assert stage_streams(_times((0.012, 0.0), [1, 8, 32]), FRAME_S, CFG, cap=40) == 40
    # a step over budget even alone: no stream can be served in real time
    assert stage_streams(_times((0.100, 0.0), [1, 2]), FRAME_S, CFG, cap=40) == 0
    # a slowed stage, 50 ms a request: one stream
    assert stage_streams(_times((0.0, 0.050), [1]), FRAME_S, CFG, cap=40) == 1
    # not measured enough yet
    assert stage_streams(_times((0.010, 0.005), [1], steps=3), FRAME_S, CFG, cap=64) is None


def test_a_stage_that_serves_a_row_per_budget_steps_several_times_within_it() -> None:
    """Code2Wav: each stream needs a window per chunk (2 s), not a row in every step, so a stage of
    8 rows a step serves as many streams as its 8-row steps fit in a chunk's time, times 8."""
    chunk_s = 25 * FRAME_S  # 1.6 s with the headroom
    times = _times((0.010, 0.005), [1, 2, 4, 8])  # 50 ms a step of 8: 32 steps in 1.6 s
    assert stage_streams(times, chunk_s, CFG, cap=1000, rows_per_step=8) == 32 * 8
    assert stage_streams(times, chunk_s, CFG, cap=100, rows_per_step=8) == 100  # the fixed cap bounds it
    # measured up to 2 rows only: steps of 4 (twice that) are what is trusted, 30 ms each: 53 steps
    assert stage_streams(_times((0.010, 0.005), [1, 2]), chunk_s, CFG, cap=1000, rows_per_step=8) == 53 * 4
    # a step of its widest batch over the budget: none
    assert stage_streams(_times((2.0, 0.0), [1, 8]), chunk_s, CFG, cap=1000, rows_per_step=8) == 0
    # without rows_per_step the same steps count a stream per row: at most twice the widest measured
    assert stage_streams(times, chunk_s, CFG, cap=1000) == 16


def test_the_engine_takes_its_tightest_stage_and_adds_up_replicas() -> None:
    def worker(name: str, line: tuple[float, float], replica: int = 0, steps: int = 20) -> StageStats:
        return StageStats(name, 0, 0, 0, 0, replica=replica, step_times=_times(line, [1, 2, 4, 128], steps))

    workers = [
        worker("thinker", (0.005, 0.001)),  # (64 - 5) / 1 ms: 59
        worker("talker", (0.010, 0.005), 0),  # 10 per replica
        worker("talker", (0.010, 0.005), 1),
        worker("talker", (0.010, 0.005), 2, steps=0),  # not measured yet: counts as its siblings
        worker("code2wav", (0.050, 0.010)),  # 25 frames (2 s) a step: (1.6 - 0.05) / 0.01: 155
    ]
    budgets = {"thinker": FRAME_S, "talker": FRAME_S, "code2wav": 25 * FRAME_S}
    total, per_stage = engine_capacity(workers, budgets, dict.fromkeys(budgets, 1000), CFG)
    assert per_stage == {"thinker": 59, "talker": 30, "code2wav": 155}
    assert total == 30
    # Code2Wav at 8 rows a step (its max_batch): 130 ms steps, 12 of them in 1.6 s
    total, per_stage = engine_capacity(workers, budgets, dict.fromkeys(budgets, 1000), CFG, {"code2wav": 8})
    assert per_stage["code2wav"] == 12 * 8 and total == 30
    unmeasured = [worker("talker", (0.01, 0.005), steps=0)]
    assert engine_capacity(unmeasured, budgets, dict.fromkeys(budgets, 1000), CFG) == (
        None,
        dict.fromkeys(budgets),
    )


def test_a_refusal_says_why() -> None:
    assert Capacity(None, 3).refusal(promised=100) is None  # not measured: the fixed limits only
    assert Capacity(4, 3).refusal(promised=3) is None
    assert "measured capacity of 4" in (Capacity(4, 3).refusal(promised=4) or "")
    assert "behind real time" in (Capacity(None, 3, -0.3, stalled=True).refusal(promised=1) or "")
    # with nothing promised one stream is always admitted: only serving measures again
    assert Capacity(0, 0, -0.3, stalled=True).refusal(promised=0) is None


def test_a_restarted_worker_keeps_its_predecessors_step_times_until_it_times_a_size_itself() -> None:
    carried = ((1, 0.010, 9), (4, 0.012, 9), (16, 0.020, 9))
    assert carry_step_times(carried, ()) == carried
    assert carry_step_times(carried, ((4, 0.013, 2), (8, 0.015, 5))) == (
        (1, 0.010, 9),
        (4, 0.013, 2),
        (8, 0.015, 5),
        (16, 0.020, 9),
    )
