"""A talker step that fails while prefilling its starting requests fails exactly those, whether or not
they had a KV slot yet, and the running rows go on with the frames they get alone. Before, requests that
failed before their slot was taken were never failed: every later step retried them and failed again."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from omnivoice.bench.engine_load import EngineLoadConfig, make_requests
from omnivoice.messages import CodecChunk, NewRequest, ThinkerChunk
from omnivoice.models.dummy import NEWLINE_ID
from omnivoice.runners import talker as talker_module
from omnivoice.runners.factory import build_runners
from tests.support.engine import profile_for


@pytest.fixture(scope="module")
def built(tiny_checkpoint: Path):
    greedy = {"device": "cpu", "sampling": {"temperature": 0.0}}
    profile = profile_for(tiny_checkpoint, thinker=greedy, talker=greedy)
    runners = build_runners(profile, tiny_checkpoint, only=(("thinker", 0), ("talker", 0)))
    thinker, talker = runners[("thinker", 0)], runners[("talker", 0)]
    cfg = EngineLoadConfig(3, 3, 0, prompt_tokens=16, text_tokens=6, audio_frames=12)
    requests = [
        replace(r, talker=replace(r.talker, min_tokens=12, max_tokens=12))
        for r in make_requests(profile, thinker.spec, cfg, NEWLINE_ID, 3, "talk")
    ]
    chunks: dict[str, list[ThinkerChunk]] = {}
    for r in requests:
        thinker.accept(NewRequest(r))
    while thinker.has_work():
        for out in thinker.step():
            if isinstance(out, ThinkerChunk):
                chunks.setdefault(out.request_id, []).append(out)
    return talker, [r.request_id for r in requests], chunks


def _frames(outs: list, into: dict[str, list[np.ndarray]]) -> None:
    for out in outs:
        if isinstance(out, CodecChunk) and out.frames.shape[1]:
            into.setdefault(out.request_id, []).append(np.asarray(out.frames))


def _feed(talker, chunks: list[ThinkerChunk]) -> None:
    for chunk in chunks:
        talker.accept(chunk)


def test_a_failed_talker_prefill_fails_the_starting_requests_only(built, monkeypatch) -> None:
    talker, (running, new, later), chunks = built
    alone: dict[str, list[np.ndarray]] = {}
    _feed(talker, chunks[running])
    while talker.has_work():
        _frames(talker.step(), alone)
    slots = talker.cache.free_slots

    got: dict[str, list[np.ndarray]] = {}
    _feed(talker, chunks[running])
    _frames(talker.step(), got)
    assert talker.seqs[running].slot >= 0, "prefilled: a running row"

    def no_memory(*args, **kwargs):  # as a prompt whose inputs cannot be allocated
        raise RuntimeError("injected: out of memory building the talker prompt")

    _feed(talker, chunks[new])
    with monkeypatch.context() as m:
        m.setattr(talker_module, "prompt_inputs", no_memory)
        with pytest.raises(RuntimeError, match="injected"):
            talker.step()
        failed = talker.active_ids()
        for rid in failed:  # as the stage fails the step's requests
            talker.abort(rid)
    assert failed == [new]
    assert running in talker.seqs and new not in talker.seqs
    assert talker.cache.free_slots == slots - 1, "only the running row holds a slot"

    _feed(talker, chunks[later])  # a request after the failure starts as usual
    while talker.has_work():
        _frames(talker.step(), got)
    assert new not in got and later in got
    np.testing.assert_array_equal(np.concatenate(got[running], 1), np.concatenate(alone[running], 1))
    assert talker.cache.free_slots == slots, "every slot came back"
