"""First audio first: the playback classes, their order, and a stage that serves by them.

The policy is pure (a clock is passed in); the Code2Wav runner on the tiny model shows a stage's use
of it: with room for one chunk per step, a new request's first chunk goes before streams comfortably
ahead of playback, and a stream about to run dry goes before both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from omnivoice.config import ChunkConfig, Code2WavStage, PriorityConfig
from omnivoice.messages import CodecChunk, PcmOutput
from omnivoice.models.loader import load_model
from omnivoice.runners.code2wav import Code2WavRunner
from omnivoice.runners.priority import Playback, PlaybackPolicy, Priority, classify

FRAME_S = 0.08


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_classes_follow_the_slack() -> None:
    assert classify(0.0, None, 0.5, 2.0) == Priority.FIRST  # no audio yet
    assert classify(1.0, 0.7, 0.5, 2.0) == Priority.DRY  # 0.3 s ahead: under the low watermark
    assert classify(2.0, 0.5, 0.5, 2.0) == Priority.NORMAL
    assert classify(5.0, 1.0, 0.5, 2.0) == Priority.AHEAD  # 4 s ahead
    assert classify(1.0, 3.0, 0.5, 2.0) == Priority.DRY  # behind real time: already dry
    assert sorted(Priority) == [Priority.DRY, Priority.FIRST, Priority.NORMAL, Priority.AHEAD]
    assert [p.urgent for p in Priority] == [True, True, False, False]


def test_the_policy_orders_defers_and_reports_the_most_urgent() -> None:
    clock = Clock()
    policy = PlaybackPolicy(PriorityConfig(low_watermark_s=0.5, high_watermark_s=2.0), FRAME_S, clock)
    ahead = Playback(started_at=clock.now - 1.0, frames=50)  # 4 s of audio after 1 s: 3 s ahead
    normal = Playback(started_at=clock.now - 1.0, frames=25)  # 1 s ahead
    dry = Playback(started_at=clock.now - 1.0, frames=15)  # 0.2 s ahead
    first = Playback()
    text = Playback(stream=False)  # a text answer: FIRST until its first token, then NORMAL
    items = {"ahead": ahead, "normal": normal, "first": first, "dry": dry, "text": text}
    assert policy.order(items, items.__getitem__) == ["dry", "first", "text", "normal", "ahead"]
    assert policy.select(items, items.__getitem__, defer_ahead=True) == ["dry", "first", "text", "normal"]
    assert policy.urgency([ahead, normal]) == Priority.NORMAL
    assert policy.urgency([ahead]) == Priority.AHEAD
    assert policy.urgency([]) is None
    text.start(clock.now)
    assert policy.priority(text) == Priority.NORMAL
    # a deferred AHEAD request is not starved: while it waits, real time eats its slack
    clock.now += 1.5
    assert policy.priority(ahead) == Priority.NORMAL


def test_switched_off_everything_is_normal_and_keeps_its_order() -> None:
    policy = PlaybackPolicy(PriorityConfig(enabled=False), FRAME_S, Clock())
    items = [Playback(started_at=0.0, frames=1000), Playback(), Playback(started_at=0.0, frames=0)]
    assert policy.order(items, lambda p: p) == items
    assert policy.select(items, lambda p: p, defer_ahead=True) == items
    assert policy.urgency(items) == Priority.NORMAL


def test_watermarks_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="high_watermark_s"):
        PriorityConfig(low_watermark_s=1.0, high_watermark_s=0.5)


# ---- a stage that serves by them: Code2Wav, one chunk per step ---------------------------------------


@pytest.fixture(scope="module")
def code2wav(tiny_checkpoint: Path) -> Any:
    torch.set_num_threads(1)
    return load_model(tiny_checkpoint).model.code2wav


def _frames(n: int) -> np.ndarray:
    return np.random.default_rng(n).integers(0, 2048, (16, n), dtype=np.int64)  # [G, n]


def _runner(code2wav: Any, clock: Clock) -> Code2WavRunner:
    """One chunk per step, 4 frames (0.32 s) each; DRY under 0.1 s of slack, AHEAD over 0.3 s."""
    chunk = ChunkConfig(first_frames=4, frames=4, left_context=4, ramp=False)
    priority = PriorityConfig(low_watermark_s=0.1, high_watermark_s=0.3)
    runner = Code2WavRunner(
        code2wav, Code2WavStage(max_batch=1), chunk, torch.device("cpu"), priority=priority, frame_s=FRAME_S
    )
    runner.policy.clock = clock
    return runner


def _decoded(runner: Code2WavRunner, defer_ahead: bool = False) -> list[str]:
    return [o.request_id for o in runner.step(defer_ahead) if isinstance(o, PcmOutput)]


def _start_streams(runner: Code2WavRunner, ids: list[str]) -> None:
    """Each of `ids` plays its first chunk (0.32 s), then has two more chunks' frames waiting."""
    for rid in ids:
        runner.accept(CodecChunk(rid, _frames(4), False))
        assert _decoded(runner) == [rid]
    for rid in ids:
        runner.accept(CodecChunk(rid, _frames(8), False))


def test_a_first_chunk_goes_before_streams_ahead_of_playback(code2wav: Any) -> None:
    clock = Clock()
    runner = _runner(code2wav, clock)
    _start_streams(runner, ["a", "b"])  # 0.32 s ahead at once: AHEAD
    runner.accept(CodecChunk("new", _frames(4), False))
    assert runner.urgency() == Priority.FIRST
    assert _decoded(runner) == ["new"]  # arrival order would have been a's second chunk
    assert runner.urgency() == Priority.AHEAD
    # urgent work elsewhere on the device: the AHEAD streams wait...
    assert _decoded(runner, defer_ahead=True) == []
    # ...but not once real time has brought them back within the watermarks
    clock.now += 0.1
    assert _decoded(runner, defer_ahead=True) == ["a"]


def test_a_stream_about_to_run_dry_goes_before_a_first_chunk(code2wav: Any) -> None:
    clock = Clock()
    runner = _runner(code2wav, clock)
    _start_streams(runner, ["a"])
    clock.now += 0.25  # a: 0.07 s of its first chunk left to play: DRY
    runner.accept(CodecChunk("new", _frames(4), False))
    assert runner.urgency() == Priority.DRY
    assert _decoded(runner) == ["a"]
    assert _decoded(runner) == ["new"]


@pytest.mark.parametrize("catch_up", [True, False])
def test_a_chunk_that_would_come_after_playback_ran_dry_goes_out_short(code2wav: Any, catch_up: bool) -> None:
    clock = Clock()
    chunk = ChunkConfig(first_frames=4, frames=25, left_context=4, catch_up=catch_up)  # 4, 8, 16, 25...
    runner = Code2WavRunner(code2wav, Code2WavStage(max_batch=1), chunk, torch.device("cpu"), frame_s=FRAME_S)
    runner.policy.clock = clock
    runner.accept(CodecChunk("a", _frames(4), False))
    assert _decoded(runner) == ["a"]  # 0.32 s of audio, playing from now
    clock.now += 0.1
    runner.accept(CodecChunk("a", _frames(5), False))  # 5 of the second chunk's 8, arriving fast
    assert not runner.has_work()  # the other 3 come well before the first chunk has played
    clock.now += 0.2  # the frames came slowly after all: 0.02 s of the first chunk left to play
    assert runner.has_work() == catch_up
    if catch_up:
        (pcm,) = [o for o in runner.step() if isinstance(o, PcmOutput)]
        assert len(pcm.pcm) == 5 * runner.upsample  # what had come, without waiting for the rest


def test_a_stream_slower_than_real_time_is_not_cut_into_short_chunks(code2wav: Any) -> None:
    """Its playback runs dry whatever is decoded; short chunks would only decode their left context
    again and again, taking time from the stage that makes the frames."""
    clock = Clock()
    chunk = ChunkConfig(first_frames=4, frames=25, left_context=4, catch_up=True)
    runner = Code2WavRunner(code2wav, Code2WavStage(max_batch=1), chunk, torch.device("cpu"), frame_s=FRAME_S)
    runner.policy.clock = clock
    runner.accept(CodecChunk("a", _frames(4), False))
    assert _decoded(runner) == ["a"]
    clock.now += 2.0  # 5 of the second chunk's 8 frames came in 2 s: far slower than real time
    runner.accept(CodecChunk("a", _frames(5), False))
    assert 9 / 2.0 * FRAME_S < 1 and not runner.has_work()
    runner.accept(CodecChunk("a", _frames(3), False))
    (pcm,) = [o for o in runner.step() if isinstance(o, PcmOutput)]
    assert len(pcm.pcm) == 8 * runner.upsample  # the whole chunk, once its frames are all there
