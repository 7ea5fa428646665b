"""The calibration runs again the bursts of the batch sizes that a stage with graphs left for after
the start did not time (its steps that captured a graph are kept out of its step times), and only
those, at most REPEATS times."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from dataclasses import replace

import pytest

from omnivoice.config import parse_profile
from omnivoice.engine import calibration
from omnivoice.engine.calibration import REPEATS, calibrate, calibration_sizes, sizes_to_repeat
from omnivoice.models.dummy import REDUCED, DummySource, dummy_spec
from omnivoice.types import Capacity, Finished, GenerationRequest, ModelInfo, StageStats
from tests.engine.test_warm_burst import OUT_OF_MEMORY

STAGE = {"worker": "thread", "max_batch": 8, "max_seq_len": 256}
SIZES = (1, 2, 4, 8)


def _times(*sizes: int) -> tuple[tuple[int, float, int], ...]:
    return tuple((b, 0.01 * b, 5) for b in sizes)


def test_the_sizes_past_the_widest_a_backlogged_worker_timed_are_repeated() -> None:
    thinker = StageStats("thinker", 0, 0, 0, 0, step_times=_times(*SIZES))
    code2wav = StageStats("code2wav", 0, 0, 0, 0, step_times=(*_times(1, 2), (4, 0.05, 2)))
    widths = dict.fromkeys(("thinker", "talker", "code2wav"), 8)
    assert sizes_to_repeat(SIZES, {("code2wav", 0)}, (thinker, code2wav), widths) == (4, 8)  # 2 steps at 4
    assert sizes_to_repeat(SIZES, {("thinker", 0)}, (thinker, code2wav), widths) == ()
    assert sizes_to_repeat(SIZES, set(), (thinker, code2wav), widths) == ()  # no backlog: nothing to excuse
    fresh = StageStats("code2wav", 0, 0, 0, 0)
    assert sizes_to_repeat(SIZES, {("code2wav", 0)}, (fresh,), widths) == SIZES


def test_a_stage_whose_steps_are_narrower_than_the_bursts_is_not_repeated_for_what_it_cannot_step() -> None:
    """Code2Wav with max_batch 4 steps at most 4 of a burst of 8: having timed 4 it has timed all."""
    code2wav = StageStats("code2wav", 0, 0, 0, 0, step_times=_times(1, 2, 4))
    widths = {"thinker": 8, "talker": 8, "code2wav": 4}
    assert sizes_to_repeat(SIZES, {("code2wav", 0)}, (code2wav,), widths) == ()
    short = StageStats("code2wav", 0, 0, 0, 0, step_times=_times(1, 2))
    assert sizes_to_repeat(SIZES, {("code2wav", 0)}, (short,), widths) == (4, 8)


def test_the_bursts_go_up_to_the_narrower_language_model_not_to_code2wav() -> None:
    narrow = {"worker": "thread", "max_batch": 4, "max_seq_len": 256}
    profile = parse_profile({"stages": {"thinker": STAGE, "talker": STAGE, "code2wav": narrow}})
    assert calibration_sizes(profile.stages) == SIZES
    profile = parse_profile({"stages": {"thinker": STAGE, "talker": narrow, "code2wav": STAGE}})
    assert calibration_sizes(profile.stages) == (1, 2, 4)


class BackloggedEngine:
    """An engine whose Code2Wav worker reports graphs left for later and times a burst's steps only
    from its `untimed_runs + 1`-th run of that size on (the earlier runs captured graphs). Its bursts
    wider than `fits` (`fits_again` in the repeats) fail with `error`, out of GPU memory unless
    `out_of_memory` is False."""

    def __init__(
        self,
        untimed_runs: int,
        backlog: bool = True,
        fits: int = 64,
        fits_again: int = 64,
        error: str = OUT_OF_MEMORY,
        out_of_memory: bool = True,
    ) -> None:
        self.info = ModelInfo("tiny", 24000, ("Ethan",), "Ethan", 256)
        self.untimed_runs, self.backlog = untimed_runs, backlog
        self.fits, self.fits_again, self.error, self.out_of_memory = fits, fits_again, error, out_of_memory
        self.runs: dict[int, int] = {}
        self.bursts: list[int] = []  # the size of each burst, in the order they ran
        self._seen: set[tuple[str, int]] = set()

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[Finished, None]:
        tag, size, _ = request.request_id.rsplit("-", 2)  # calibrate[-againN]-<size>-<i>
        if (tag, int(size)) not in self._seen:
            self._seen.add((tag, int(size)))
            self.bursts.append(int(size))
            self.runs[int(size)] = self.runs.get(int(size), 0) + 1
        await asyncio.sleep(0)
        if int(size) > (self.fits if tag == "calibrate" else self.fits_again):
            yield Finished(request.request_id, "error", error=self.error, out_of_memory=self.out_of_memory)
        else:
            yield Finished(request.request_id, "length")

    def replica_stats(self) -> tuple[StageStats, ...]:
        timed = [b for b, n in self.runs.items() if n > (self.untimed_runs if b > 2 else 0)]
        stats = StageStats("code2wav", 0, 0, 0, 0, step_times=_times(*sorted(timed)))
        pending = 3 if self.backlog else 0
        return (
            StageStats("thinker", 0, 0, 0, 0, step_times=_times(*sorted(self.runs))),
            replace(stats, graphs_pending=pending),
        )

    def capacity(self) -> Capacity:
        return Capacity(8, 0, stages=(("thinker", 8), ("code2wav", 8)))


def _calibrate(engine: BackloggedEngine) -> int:
    """The widest burst that went through."""
    profile = parse_profile({"stages": {"thinker": STAGE, "talker": STAGE, "code2wav": STAGE}})
    assert calibration_sizes(profile.stages) == SIZES
    spec = dummy_spec(DummySource("qwen3-omni-30b-a3b", overrides=REDUCED))
    return calibrate(engine, profile.stages, spec, newline_id=10)  # type: ignore[arg-type]


def test_untimed_wide_sizes_run_again_until_timed(caplog: pytest.LogCaptureFixture) -> None:
    engine = BackloggedEngine(untimed_runs=1)
    with caplog.at_level(logging.INFO, logger=calibration.__name__):
        _calibrate(engine)
    assert engine.bursts == [1, 2, 4, 8, 4, 8]  # the sizes Code2Wav did not time, once more
    assert "at batch sizes 4,8 and timed too few; running them again (1 of 2)" in caplog.text


def test_the_repeats_stop_after_repeats_rounds() -> None:
    engine = BackloggedEngine(untimed_runs=10)
    _calibrate(engine)
    assert engine.bursts == [1, 2, 4, 8] + [4, 8] * REPEATS


def test_without_a_backlog_no_size_runs_again() -> None:
    engine = BackloggedEngine(untimed_runs=10, backlog=False)
    _calibrate(engine)
    assert engine.bursts == list(SIZES)


def test_a_burst_out_of_memory_ends_the_calibration_at_the_sizes_before_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = BackloggedEngine(untimed_runs=0, backlog=False, fits=2)
    with caplog.at_level(logging.INFO, logger=calibration.__name__):
        assert _calibrate(engine) == 2
    assert engine.bursts == [1, 2, 4]  # not 8: wider still
    assert (
        "the calibration burst of 4 failed (4): calibrate-4-0: error: talker: out of GPU memory"
        in caplog.text
    )
    assert "calibrated up to 2, the widest that GPU memory allows" in caplog.text
    assert "capacity calibrated in" in caplog.text and "at batch sizes 1,2:" in caplog.text


def test_a_repeat_out_of_memory_narrows_the_calibration_too() -> None:
    engine = BackloggedEngine(untimed_runs=1, fits_again=4)
    assert _calibrate(engine) == 4
    assert engine.bursts == [1, 2, 4, 8, 4, 8]  # no second round past the failed 8
    assert _calibrate(BackloggedEngine(untimed_runs=0)) == 8


def test_a_calibration_failing_otherwise_or_at_its_first_size_fails_the_start() -> None:
    other = BackloggedEngine(
        untimed_runs=0, backlog=False, fits=2, error="thinker: the grammar failed", out_of_memory=False
    )
    with pytest.raises(RuntimeError, match=r"the calibration burst of 4 failed \(4\): .*the grammar failed"):
        _calibrate(other)
    assert other.bursts == [1, 2, 4]
    none = BackloggedEngine(untimed_runs=0, backlog=False, fits=0)
    with pytest.raises(RuntimeError, match=r"the calibration's narrowest burst \(1\) ran out of GPU memory"):
        _calibrate(none)
    assert none.bursts == [1]
