"""Engine admission: a request that would overfill a stage replica (max_batch + max_queue) is refused
at once with EngineOverloaded, and the requests already admitted finish normally."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from omnivoice.config import parse_profile
from omnivoice.engine.engine import Engine
from omnivoice.types import (
    ChatMessage,
    EngineOverloaded,
    Finished,
    GenerationRequest,
    Sampling,
    TextPart,
)


@pytest.fixture(scope="module")
def engine(tiny_checkpoint: Path):
    stage = {"worker": "thread", "max_seq_len": 512, "max_batch": 1, "max_queue": 1}
    stages = {"thinker": stage, "talker": stage, "code2wav": stage}
    profile = parse_profile({"model": {"path": str(tiny_checkpoint)}, "stages": stages})
    engine = Engine.start_sync(profile)
    yield engine
    asyncio.run(engine.close())


def _request(engine: Engine, n: int, tokens: int = 48, audio: bool = True) -> GenerationRequest:
    prompt = engine.build_prompt([ChatMessage("user", (TextPart("tell me about the sea"),))])
    return GenerationRequest(
        f"adm-{n}-{time.monotonic_ns()}",
        prompt,
        want_audio=audio,
        voice="ethan",
        thinker=Sampling(max_tokens=tokens, min_tokens=tokens),
        talker=Sampling(max_tokens=tokens, min_tokens=tokens),
    )


async def _run(engine: Engine, req: GenerationRequest) -> Finished:
    async for out in engine.generate(req):
        if isinstance(out, Finished):
            return out
    raise AssertionError("no Finished")


def test_a_full_stage_refuses_at_once_and_the_admitted_requests_finish(engine: Engine) -> None:
    async def main() -> None:
        admitted = [asyncio.create_task(_run(engine, _request(engine, i))) for i in range(2)]
        await asyncio.sleep(0)  # both are registered (generate runs up to its first await)
        assert engine.stats().active_requests == 2
        extra = _request(engine, 9)
        assert engine.overloaded(extra) is not None and "thinker" in engine.overloaded(extra)
        t0 = time.perf_counter()
        for _ in range(20):  # a flood of extra requests: each refused at once, nothing registered
            with pytest.raises(EngineOverloaded):
                await _run(engine, _request(engine, 9))
        assert not any(t.done() for t in admitted)  # refused while the admitted ones still run
        assert time.perf_counter() - t0 < 10  # at once: no refusal waited for a slot
        assert engine.stats().active_requests == 2
        done = await asyncio.wait_for(asyncio.gather(*admitted), 120)
        assert [f.finish_reason for f in done] == ["length", "length"]
        assert all(f.usage.audio_frames > 0 for f in done)
        assert engine.stats().active_requests == 0 and engine.replica_load() == [[0], [0], [0]]
        assert engine.overloaded(extra) is None
        assert (await _run(engine, _request(engine, 10, tokens=4))).finish_reason == "length"

    asyncio.run(main())


def test_text_only_requests_count_against_the_thinker_only(engine: Engine) -> None:
    async def main() -> None:
        running = [asyncio.create_task(_run(engine, _request(engine, i, audio=False))) for i in range(2)]
        await asyncio.sleep(0)
        with pytest.raises(EngineOverloaded, match="thinker"):
            await _run(engine, _request(engine, 3, audio=False))
        await asyncio.wait_for(asyncio.gather(*running), 120)
        assert engine.replica_load() == [[0], [0], [0]]

    asyncio.run(main())
