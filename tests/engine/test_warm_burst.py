"""The warm-up burst: a full batch of short requests through every stage before the engine serves."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from omnivoice.config import parse_profile
from omnivoice.engine import warm_burst
from omnivoice.engine.engine import Engine
from omnivoice.models.dummy import REDUCED, DummySource, dummy_spec
from omnivoice.types import AudioChunk, Finished, GenerationRequest, ModelInfo, Prompt, Sampling, TextDelta
from tests.support.polling import until

STAGE = {"worker": "thread", "max_batch": 3, "max_seq_len": 256}


def _profile(**stages: object) -> dict:
    return {"stages": {"thinker": STAGE, "talker": STAGE, "code2wav": STAGE, **stages}}


def test_the_burst_is_on_by_default_only_for_a_cuda_thinker() -> None:
    assert not parse_profile(_profile()).stages.warms_burst()
    cuda = {**STAGE, "device": "cuda:0"}
    assert parse_profile(_profile(thinker=cuda)).stages.warms_burst()
    assert not parse_profile(_profile(thinker=cuda, warm_burst=False)).stages.warms_burst()
    replicas = {**STAGE, "replicas": 2, "devices": ["cuda:0", "cuda:1"]}
    assert parse_profile(_profile(thinker=replicas)).stages.warms_burst()
    assert parse_profile(_profile(warm_burst=True)).stages.warms_burst()


def test_the_burst_is_as_wide_as_the_narrower_language_model_not_code2wav() -> None:
    spec = dummy_spec(DummySource("qwen3-omni-30b-a3b", overrides=REDUCED))
    info = ModelInfo("tiny", 24000, ("Ethan",), "Ethan", 256)
    narrow = {**STAGE, "max_batch": 1}
    wide = {**STAGE, "max_batch": 4}
    profile = parse_profile({"stages": {"thinker": wide, "talker": STAGE, "code2wav": narrow}})
    assert len(warm_burst.burst_requests(profile.stages, spec, info, newline_id=10)) == 3


def _stage_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if "stage" in t.name or "worker" in t.name}


async def test_the_burst_runs_a_batch_through_every_stage_then_the_engine_serves(
    tiny_checkpoint: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With the checkpoint's tokenizer (the newline id comes from it): the burst's requests end before
    `start` returns, every stage stepped, nothing is left running, and a request is then served."""
    profile = parse_profile({"model": {"path": str(tiny_checkpoint)}, **_profile(warm_burst=True)})
    with caplog.at_level(logging.INFO, logger="omnivoice.engine.warm_burst"):
        engine = await Engine.start(profile)
    try:
        assert "warm-up burst: 3 requests of 239 prompt tokens through every stage" in caplog.text

        def stepped_and_idle() -> bool:  # each stage's figures follow its last outputs
            stages = engine.stats().stages
            return all(s.steps > 0 and s.running == 0 and s.queued == 0 for s in stages)

        await until(stepped_and_idle, what="every stage stepped and idle after the burst")
        prompt = Prompt(input_ids=tuple(range(10, 30)))
        thinker, talker = Sampling(max_tokens=3, min_tokens=3), Sampling(max_tokens=6, min_tokens=6)
        request = GenerationRequest("after-the-burst", prompt, thinker=thinker, talker=talker)
        outputs = [out async for out in engine.generate(request)]
    finally:
        await engine.close()
    assert any(isinstance(o, TextDelta) for o in outputs) and any(isinstance(o, AudioChunk) for o in outputs)
    assert isinstance(outputs[-1], Finished) and outputs[-1].finish_reason == "length"


def test_a_failed_burst_stops_the_stages_and_fails_the_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A burst request that fails (here one longer than the thinker's context: the engine's own refusal)
    fails the start with what went wrong, and the stages it started are stopped."""
    made = warm_burst.burst_requests

    def too_long(*args: Any) -> list[GenerationRequest]:
        requests = made(*args)
        long = Prompt(input_ids=requests[0].prompt.input_ids * 2)
        return [GenerationRequest("warm-burst-too-long", long), *requests[1:]]

    monkeypatch.setattr(warm_burst, "burst_requests", too_long)
    before = _stage_threads()
    source = DummySource("qwen3-omni-30b-a3b", overrides=REDUCED)
    profile = parse_profile({**_profile(warm_burst=True), "model": {"cache_dir": str(tmp_path)}})
    failed = r"the warm-up burst failed \(1 of 3\): warm-burst-too-long: error"
    with pytest.raises(RuntimeError, match=failed):
        Engine.start_sync(profile, source=source)
    assert _stage_threads() <= before
