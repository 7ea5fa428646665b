"""The warm-up burst: a full batch of short requests through every stage before the engine serves."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest
import torch

from omnivoice.config import parse_profile
from omnivoice.engine import warm_burst
from omnivoice.engine.engine import Engine
from omnivoice.models.dummy import REDUCED, DummySource, dummy_spec
from omnivoice.runners.talker import TalkerRunner
from omnivoice.types import (
    AudioChunk,
    EngineOverloaded,
    Finished,
    GenerationRequest,
    ModelInfo,
    Prompt,
    Sampling,
    TextDelta,
)
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


OUT_OF_MEMORY = "talker: out of GPU memory in this step; retry shortly (the server's log has the details)"


def _burst_width(request_id: str, full: int) -> int:
    """The width of the burst a request belongs to: warm-burst-<i> (the full width) or -w<rows>-<i>."""
    tag = request_id.removeprefix("warm-burst-").split("-")
    return int(tag[0][1:]) if len(tag) == 2 else full


class ShortOfMemory:
    """An engine whose steps run out of GPU memory in any burst wider than `fits` (`error`, without
    `out_of_memory`: the failure it reports instead, for a failure of another kind)."""

    def __init__(self, full: int, fits: int, error: str = OUT_OF_MEMORY, out_of_memory: bool = True) -> None:
        self.info = ModelInfo("tiny", 24000, ("Ethan",), "Ethan", 256)
        self.full, self.fits, self.error, self.out_of_memory = full, fits, error, out_of_memory
        self.widths: list[int] = []  # the width of each burst, in the order they ran

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[Finished, None]:
        width = _burst_width(request.request_id, self.full)
        if not self.widths or self.widths[-1] != width:
            self.widths.append(width)
        await asyncio.sleep(0)
        if width > self.fits:
            yield Finished(request.request_id, "error", error=self.error, out_of_memory=self.out_of_memory)
        else:
            yield Finished(request.request_id, "length")


def _run(engine: ShortOfMemory, max_batch: int) -> int:
    stage = {**STAGE, "max_batch": max_batch}
    profile = parse_profile({"stages": {"thinker": stage, "talker": stage, "code2wav": STAGE}})
    spec = dummy_spec(DummySource("qwen3-omni-30b-a3b", overrides=REDUCED))
    return warm_burst.warm_burst(engine, profile.stages, spec, newline_id=10)  # type: ignore[arg-type]


def test_a_burst_out_of_memory_runs_again_at_half_its_width_until_one_goes_through(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = ShortOfMemory(full=8, fits=2)
    with caplog.at_level(logging.WARNING, logger="omnivoice.engine.warm_burst"):
        assert _run(engine, 8) == 2
    assert engine.widths == [8, 4, 2]
    said = [r.getMessage() for r in caplog.records if r.name == "omnivoice.engine.warm_burst"]
    assert [line.split(";")[-1].strip() for line in said] == ["trying 4", "trying 2"]
    assert "8 of 8 requests ran out of GPU memory" in said[0]
    whole = ShortOfMemory(full=8, fits=8)
    assert _run(whole, 8) == 8 and whole.widths == [8]


def test_a_burst_that_fails_otherwise_or_at_one_request_fails_the_start() -> None:
    other = ShortOfMemory(
        full=8, fits=2, error="talker: the request's prompt leaves no room for audio", out_of_memory=False
    )
    with pytest.raises(RuntimeError, match=r"the warm-up burst failed \(8 of 8\): .*no room for audio"):
        _run(other, 8)
    assert other.widths == [8]  # not tried narrower: memory was not what failed it
    # the request's end says whether memory failed it, not its words
    worded = ShortOfMemory(full=8, fits=2, out_of_memory=False)
    with pytest.raises(RuntimeError, match=r"the warm-up burst failed \(8 of 8\): .*out of GPU memory"):
        _run(worded, 8)
    assert worded.widths == [8]
    none = ShortOfMemory(full=4, fits=0)
    with pytest.raises(RuntimeError, match=r"the warm-up burst failed \(1 of 1\): .*out of GPU memory"):
        _run(none, 4)
    assert none.widths == [4, 2, 1]


async def test_a_start_short_of_memory_serves_the_width_that_went_through(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The talker's prefill runs out of memory (injected: a CPU cannot be made to) for the rows of any
    burst wider than one: the start narrows the engine to one request at a time and says so; while one
    request runs another is refused at once, and once it is cancelled the next is served."""
    real = TalkerRunner._prefill

    def short_of_memory(self: TalkerRunner, seqs: list[Any]) -> list[Any]:
        if any(
            _burst_width(s.request.request_id, 3) > 1 for s in seqs if s.request.request_id.startswith("warm")
        ):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB (injected)")
        return real(self, seqs)

    monkeypatch.setattr(TalkerRunner, "_prefill", short_of_memory)
    profile = parse_profile({"model": {"path": str(tiny_checkpoint)}, **_profile(warm_burst=True)})
    with caplog.at_level(logging.INFO, logger="omnivoice.engine"):
        engine = await Engine.start(profile)
    try:
        assert engine.narrowed == 1 and engine.stats().narrowed == 1
        said = caplog.text
        assert "warm-up burst: 3 of 3 requests ran out of GPU memory" in said
        assert "warm-up burst: 1 requests of 239 prompt tokens through every stage" in said
        assert "the start found GPU memory for batches of 1 requests, not 3" in said
        prompt = Prompt(input_ids=tuple(range(10, 30)))
        # one request of 200 tokens and frames holds the engine's one place from its submit on
        long = Sampling(max_tokens=200, min_tokens=200)
        held: list[Any] = []
        rid = engine.submit(GenerationRequest("held", prompt, thinker=long, talker=long), held.append)
        second = GenerationRequest("second", prompt, thinker=long, talker=long)
        full = "the server is at capacity: its GPU memory allows 1 request at a time; retry shortly"
        assert engine.overloaded(second) == full
        with pytest.raises(EngineOverloaded, match="allows 1 request at a time"):
            engine.submit(second, held.append)
        engine.cancel(rid)  # its place is given back: the next request is served
        thinker, talker = Sampling(max_tokens=3, min_tokens=3), Sampling(max_tokens=6, min_tokens=6)
        request = GenerationRequest("after", prompt, thinker=thinker, talker=talker)
        outputs = [out async for out in engine.generate(request)]
    finally:
        await engine.close()
    assert [o.finish_reason for o in held if isinstance(o, Finished)] == ["abort"]
    assert any(isinstance(o, AudioChunk) for o in outputs)
    assert isinstance(outputs[-1], Finished) and outputs[-1].finish_reason == "length"
