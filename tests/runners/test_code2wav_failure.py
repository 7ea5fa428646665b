"""A Code2Wav step that fails fails the streams it was decoding; the others go on from where they were."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from omnivoice.messages import CodecChunk, PcmOutput, StageFinished
from omnivoice.runners.factory import build_runners
from tests.support.engine import profile_for


@pytest.fixture
def code2wav(tiny_checkpoint: Path):
    stage = {"device": "cpu", "max_batch": 1, "chunk": {"first_frames": 4, "frames": 4, "catch_up": False}}
    profile = profile_for(tiny_checkpoint, code2wav=stage)
    return build_runners(profile, tiny_checkpoint, only=(("code2wav", 0),))[("code2wav", 0)]


def _frames(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 100, size=(16, n), dtype=np.int64)


def test_a_failed_decode_fails_its_own_streams_only(code2wav, monkeypatch: pytest.MonkeyPatch) -> None:
    code2wav.accept(CodecChunk("a", _frames(8, 1), True, first=True))
    code2wav.accept(CodecChunk("b", _frames(8, 2), True, first=True))
    real = code2wav._decode
    calls: list[int] = []

    def short_of_memory_once(chunks):  # type: ignore[no-untyped-def]
        calls.append(len(chunks))
        if len(calls) == 1:  # a device out of memory cannot be caused on demand
            raise RuntimeError("injected: out of memory decoding the window")
        return real(chunks)

    monkeypatch.setattr(code2wav, "_decode", short_of_memory_once)
    with pytest.raises(RuntimeError, match="injected"):
        code2wav.step()
    failed = code2wav.active_ids()
    assert len(failed) == 1 and set(code2wav.streams) == {"a", "b"}  # one row a step: one stream's
    for rid in failed:  # what the stage does with a failed step's requests
        code2wav.abort(rid)
    (left,) = set("ab") - set(failed)
    assert code2wav.active_ids() == [left]
    outs = []
    while code2wav.has_work() or code2wav.streams:
        outs += code2wav.step()
    pcm = [o for o in outs if isinstance(o, PcmOutput)]
    assert {o.request_id for o in pcm} == {left} and [o.index for o in pcm] == [0, 1]
    assert [(o.request_id, o.reason, o.count) for o in outs if isinstance(o, StageFinished)] == [
        (left, "stop", 8)
    ]
