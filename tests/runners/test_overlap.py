"""Overlapped thinker and talker steps (the GPU default: a step's results are read back after the
next step is queued) give exactly the tokens and frames of synchronous steps. A request that samples
its end token was already queued for one more step; that row must be dropped, its slot freed, and
nothing else changed. The CPU runs the same code with `overlap` switched on."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from omnivoice.bench.engine_load import EngineLoadConfig, make_requests
from omnivoice.bench.parity import compare, drive
from omnivoice.config import parse_profile
from omnivoice.messages import CodecChunk, NewRequest, StageFinished, ThinkerChunk
from omnivoice.models.dummy import NEWLINE_ID
from omnivoice.runners.factory import build_runners

MIN_FRAMES = (3, 7, 8, 12, 20)  # each request's talker ends (greedy end token) right after these
MIN_TOKENS = (2, 9, 4, 30, 6)  # and its thinker after these (the fourth at its limit of 10 instead)


@pytest.fixture(scope="module")
def runners(tiny_checkpoint: Path):
    stage = {"device": "cpu", "worker": "thread", "max_batch": 8, "max_seq_len": 512}
    profile = parse_profile(
        {
            "model": {"path": str(tiny_checkpoint)},
            "stages": {
                "thinker": {**stage, "sampling": {"temperature": 0.0}},
                "talker": {**stage, "sampling": {"temperature": 0.0}},
            },
        }
    )
    built = build_runners(profile, tiny_checkpoint, only=(("thinker", 0), ("talker", 0)))
    thinker, talker = built[("thinker", 0)], built[("talker", 0)]

    def end_is_best(end: int):
        def hook(module, args, out):  # once min_tokens allows it, greedy picks the end token
            out = out.clone()
            out[..., end] += 1e4
            return out

        return hook

    hooks = [
        talker.model.codec_head.register_forward_hook(end_is_best(talker.spec.codec_eos_id)),
        thinker.model.lm_head.register_forward_hook(end_is_best(thinker.spec.thinker_eos_ids[0])),
    ]
    cfg = EngineLoadConfig(5, 5, 0, prompt_tokens=24, text_tokens=10, audio_frames=40)
    made = make_requests(profile, thinker.spec, cfg, NEWLINE_ID, 5, "overlap")
    requests = [
        replace(
            r,
            thinker=replace(r.thinker, min_tokens=min(t, 10), max_tokens=10),
            talker=replace(r.talker, min_tokens=m, max_tokens=100),
        )
        for r, m, t in zip(made, MIN_FRAMES, MIN_TOKENS, strict=True)
    ]
    yield thinker, talker, requests
    for hook in hooks:
        hook.remove()


def _overlap(thinker, talker, on: bool) -> None:
    thinker.overlap = talker.overlap = on


def test_overlapped_steps_give_the_tokens_and_frames_of_synchronous_ones(runners) -> None:
    thinker, talker, requests = runners
    plain = drive(thinker, talker, requests)
    _overlap(thinker, talker, True)
    try:
        overlapped = drive(thinker, talker, requests)
    finally:
        _overlap(thinker, talker, False)
    result = compare(plain, overlapped)
    assert result["identical"], result
    # each request stopped at its end token, a different step for each (one thinker at its limit)
    assert [plain.frames[r.request_id].shape[1] for r in requests] == list(MIN_FRAMES)
    assert [len(plain.tokens[r.request_id]) for r in requests] == [3, 10, 5, 10, 7]
    assert [plain.tokens[r.request_id][-1] for r in requests].count(thinker.spec.thinker_eos_ids[0]) == 4
    for runner in (thinker, talker):
        assert runner.cache.free_slots == runner.cache.k.shape[1] - 1 and not runner.has_work()


def test_an_abort_between_queued_steps_drops_the_request_and_frees_its_slot(runners) -> None:
    thinker, talker, requests = runners
    _overlap(thinker, talker, True)
    victim = requests[4].request_id
    frames: dict[str, int] = {}
    finished: dict[str, str] = {}
    try:
        for r in requests:
            thinker.accept(NewRequest(r))
        talker_steps = 0
        while thinker.has_work() or talker.has_work():
            if thinker.has_work():
                for out in thinker.step():
                    if isinstance(out, ThinkerChunk):
                        talker.accept(out)  # the victim's, after the abort, are ignored
            if talker.has_work():
                for out in talker.step():
                    assert out.request_id != victim or talker_steps < 6, out
                    if isinstance(out, CodecChunk):
                        frames[out.request_id] = frames.get(out.request_id, 0) + out.frames.shape[1]
                    elif isinstance(out, StageFinished):
                        finished[out.request_id] = out.reason
                talker_steps += 1
                if talker_steps == 6:
                    assert talker._queued  # a step of the victim is still being computed
                    talker.abort(victim)
    finally:
        _overlap(thinker, talker, False)
    assert victim not in finished and frames.get(victim, 0) < MIN_FRAMES[4]
    assert {rid: frames[rid] for rid in finished} == {
        r.request_id: m for r, m in zip(requests[:4], MIN_FRAMES[:4], strict=True)
    }
    assert set(finished.values()) == {"stop"}
    assert talker.cache.free_slots == talker.cache.k.shape[1] - 1 and not talker.seqs
    assert not talker.sampler.generators and np.all(np.asarray(talker.cache.lengths) == 0)
