"""The staged engine against transformers' own generate(), on the tiny checkpoint."""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from omnivoice.config import Profile, parse_profile
from omnivoice.engine.engine import RESTARTING, STOPPED, Engine
from omnivoice.models.loader import load_model
from omnivoice.models.reference import reference_generate
from omnivoice.types import (
    TALKER_PROMPT_EXTRA,
    AudioChunk,
    AudioPart,
    ChatMessage,
    Finished,
    GenerationRequest,
    Sampling,
    TextDelta,
    TextPart,
)

THINKER_TOKENS = 24
TALKER_TOKENS = 70  # 69 frames: several 25-frame chunks after the first 4-frame one


def profile_for(checkpoint: Path, worker: str = "thread", left_context: int = 25) -> Profile:
    stage = {"worker": worker, "max_seq_len": 512, "max_batch": 4}
    return parse_profile(
        {
            "model": {"path": str(checkpoint)},
            "stages": {
                "thinker": stage,
                "talker": stage,
                "code2wav": {
                    **stage,
                    "chunk": {"first_frames": 4, "frames": 25, "left_context": left_context},
                },
            },
        }
    )


def messages(i: int) -> list[ChatMessage]:
    texts = ["hello there, how are you?", "tell me a long story about the sea and the wind", "hi"]
    parts: tuple = (TextPart(texts[i % 3]),)
    if i == 1:  # one request speaks: 1.5 s of a chirp at 16 kHz
        t = np.arange(24000) / 16000
        parts = (AudioPart((0.3 * np.sin(2 * np.pi * (200 + 300 * t) * t)).astype(np.float32), 16000), *parts)
    return [ChatMessage("system", (TextPart("be brief"),)), ChatMessage("user", parts)]


def request(engine: Engine, i: int, want_audio: bool = True, **kw) -> GenerationRequest:
    thinker = kw.pop("thinker_tokens", THINKER_TOKENS)
    talker = kw.pop("talker_tokens", TALKER_TOKENS)
    return GenerationRequest(
        f"req-{i}-{os.urandom(3).hex()}",
        engine.build_prompt(messages(i)),
        want_audio=want_audio,
        voice="ethan",
        thinker=Sampling(max_tokens=thinker, min_tokens=thinker),
        talker=Sampling(max_tokens=talker, min_tokens=talker, repetition_penalty=1.05),
    )


async def collect(engine: Engine, req: GenerationRequest) -> tuple[list, Finished]:
    outs = [o async for o in engine.generate(req)]
    assert isinstance(outs[-1], Finished)
    return outs[:-1], outs[-1]


def audio_of(outs: list) -> np.ndarray:
    chunks = [o.pcm for o in outs if isinstance(o, AudioChunk)]
    return np.concatenate(chunks) if chunks else np.zeros(0, np.float32)


def tokens_of(outs: list) -> list[int]:
    return [t for o in outs if isinstance(o, TextDelta) for t in o.token_ids]


async def wait_idle(engine: Engine, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        st = engine.stats()
        if st.active_requests == 0 and all(s.running == 0 and s.queued == 0 for s in st.stages):
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"engine not idle: {st}")
        await asyncio.sleep(0.05)


@pytest.fixture(scope="module")
def reference_model(tiny_checkpoint: Path):
    torch.set_num_threads(1)
    return load_model(tiny_checkpoint)


@pytest.fixture
async def engine(tiny_checkpoint: Path):
    eng = await Engine.start(profile_for(tiny_checkpoint))
    yield eng
    await eng.close()


async def test_concurrent_requests_match_transformers_generate(engine: Engine, reference_model) -> None:
    reqs = [request(engine, i) for i in range(3)]
    results = await asyncio.gather(*(collect(engine, r) for r in reqs))
    for req, (outs, fin) in zip(reqs, results, strict=True):
        ref_ids, ref_codes, ref_wav = reference_generate(
            reference_model.model, reference_model.spec, req.prompt, "ethan", THINKER_TOKENS, TALKER_TOKENS
        )
        assert tokens_of(outs) == ref_ids
        assert fin.finish_reason == "length"
        assert fin.usage.completion_tokens == THINKER_TOKENS
        assert fin.usage.audio_frames == ref_codes.shape[1] == TALKER_TOKENS - 1
        wav = audio_of(outs)
        # gap-free: exactly as many samples as one decode of all frames
        assert wav.shape == ref_wav.shape
        # 25 frames of left context: streamed audio equals the full decode to ~1% of its peak
        assert np.abs(wav - ref_wav).max() <= 0.02 * np.abs(ref_wav).max()
    st = engine.stats()
    assert max(s.last_batch_size for s in st.stages if s.name == "talker") >= 1


async def test_long_left_context_makes_streamed_audio_equal_full_decode(
    tiny_checkpoint, reference_model
) -> None:
    eng = await Engine.start(profile_for(tiny_checkpoint, left_context=200))
    try:
        req = request(eng, 0)
        outs, _ = await collect(eng, req)
    finally:
        await eng.close()
    _, _, ref_wav = reference_generate(
        reference_model.model, reference_model.spec, req.prompt, "ethan", THINKER_TOKENS, TALKER_TOKENS
    )
    np.testing.assert_allclose(audio_of(outs), ref_wav, rtol=0, atol=1e-5)


async def test_first_audio_arrives_before_the_thinker_finishes(engine: Engine) -> None:
    req = request(engine, 2, thinker_tokens=96, talker_tokens=40)
    outs, _ = await collect(engine, req)
    kinds = [type(o).__name__ for o in outs]
    first_audio = kinds.index("AudioChunk")
    last_text = len(kinds) - 1 - kinds[::-1].index("TextDelta")
    assert first_audio < last_text, "audio only started after the whole text was written"
    sizes = [len(o.pcm) for o in outs if isinstance(o, AudioChunk)]
    # ramped chunks of 4, 8, 16 frames, then 25 (minus the vocoder's held-back tail, plus the last one's)
    assert sizes[0] <= 4 * 1920
    assert 7 * 1920 < sizes[1] <= 8 * 1920 + 600 and 15 * 1920 < sizes[2] <= 16 * 1920 + 600


async def test_batched_steps_happen_in_every_stage(engine: Engine) -> None:
    seen = {"thinker": 0, "talker": 0, "code2wav": 0}

    async def watch() -> None:
        while True:
            for s in engine.stats().stages:
                seen[s.name] = max(seen[s.name], s.last_batch_size)
            await asyncio.sleep(0.01)

    watcher = asyncio.create_task(watch())
    try:
        await asyncio.gather(*(collect(engine, request(engine, i, talker_tokens=120)) for i in range(4)))
    finally:
        watcher.cancel()
    assert seen["thinker"] >= 2 and seen["talker"] >= 2 and seen["code2wav"] >= 2, seen


async def test_text_only_request_produces_no_audio(engine: Engine) -> None:
    outs, fin = await collect(engine, request(engine, 0, want_audio=False))
    assert not any(isinstance(o, AudioChunk) for o in outs)
    assert len(tokens_of(outs)) == THINKER_TOKENS
    assert fin.finish_reason == "length" and fin.usage.audio_frames == 0


async def test_leaving_the_stream_aborts_the_request_in_every_stage(engine: Engine) -> None:
    req = request(engine, 0, thinker_tokens=200, talker_tokens=400)
    gen = engine.generate(req)
    async for out in gen:
        if isinstance(out, AudioChunk):
            break
    await gen.aclose()
    await wait_idle(engine)
    # and the engine still serves
    outs, fin = await collect(engine, request(engine, 2, thinker_tokens=4, talker_tokens=10))
    assert fin.finish_reason == "length" and len(tokens_of(outs)) == 4


async def test_abort_by_id_finishes_the_stream(engine: Engine) -> None:
    req = request(engine, 0, thinker_tokens=200, talker_tokens=400)
    outs: list = []

    async def consume() -> None:
        async for out in engine.generate(req):
            outs.append(out)

    task = asyncio.create_task(consume())
    while not any(isinstance(o, AudioChunk) for o in outs):
        await asyncio.sleep(0.01)
    await engine.abort(req.request_id)
    await asyncio.wait_for(task, 5)
    assert isinstance(outs[-1], Finished) and outs[-1].finish_reason == "abort"
    await wait_idle(engine)


async def test_process_workers_match_thread_workers(tiny_checkpoint: Path) -> None:
    shm_before = {n for n in os.listdir("/dev/shm") if n.startswith("psm_")}
    eng = await Engine.start(profile_for(tiny_checkpoint, worker="process"))
    try:
        reqs = [request(eng, i) for i in range(2)]
        proc = await asyncio.gather(*(collect(eng, r) for r in reqs))
    finally:
        await eng.close()
    eng = await Engine.start(profile_for(tiny_checkpoint))
    try:
        thread = await asyncio.gather(*(collect(eng, r) for r in reqs))
    finally:
        await eng.close()
    for (p_outs, _), (t_outs, _) in zip(proc, thread, strict=True):
        assert tokens_of(p_outs) == tokens_of(t_outs)
        # code2wav decodes same-length windows of several requests together, and which chunks share a
        # forward depends on timing: a batched convolution may round differently in the last bits
        a, b = audio_of(p_outs), audio_of(t_outs)
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * float(np.abs(b).max()))
    assert {n for n in os.listdir("/dev/shm") if n.startswith("psm_")} - shm_before == set()


async def test_a_killed_stage_process_fails_its_requests_and_the_stages_restart_unless_held(
    tiny_checkpoint: Path,
) -> None:
    import signal

    shm_before = {n for n in os.listdir("/dev/shm") if n.startswith("psm_")}
    eng = await Engine.start(profile_for(tiny_checkpoint, worker="process"))
    try:
        req = request(eng, 0, thinker_tokens=200, talker_tokens=400)
        outs: list = []

        async def consume() -> None:
            async for out in eng.generate(req):
                outs.append(out)

        task = asyncio.create_task(consume())
        while not any(isinstance(o, AudioChunk) for o in outs):
            await asyncio.sleep(0.01)
        talker = next(p for p in eng._pipeline.processes if "-talker-" in p.name)
        os.kill(talker.pid, signal.SIGKILL)
        await asyncio.wait_for(task, 10)
        assert isinstance(outs[-1], Finished) and outs[-1].finish_reason == "error"
        # clients are told the engine stopped, not which process died how (that is for the log)
        assert outs[-1].error == eng.failure == RESTARTING
        with pytest.raises(RuntimeError, match="restarting"):
            await collect(eng, request(eng, 2))
        # the supervisor brings fresh stages up and the next requests succeed
        deadline = asyncio.get_running_loop().time() + 90
        while eng.failure is not None:
            assert asyncio.get_running_loop().time() < deadline, eng.failure
            await asyncio.sleep(0.2)
        outs, fin = await collect(eng, request(eng, 2, thinker_tokens=4, talker_tokens=10))
        assert fin.finish_reason == "length" and len(tokens_of(outs)) == 4
        # once the server shuts down (its drain holds restarts), a dead worker is not brought back
        eng.hold_restarts()
        pipeline = eng._pipeline
        thinker = next(p for p in pipeline.processes if "-thinker-" in p.name)
        os.kill(thinker.pid, signal.SIGKILL)
        while eng.failure is None:
            assert asyncio.get_running_loop().time() < deadline + 30
            await asyncio.sleep(0.05)
        assert eng.failure == STOPPED and not eng.restarting and eng._pipeline is pipeline
    finally:
        await eng.close()
    leaked = {n for n in os.listdir("/dev/shm") if n.startswith("psm_")} - shm_before
    assert leaked == set(), leaked


async def test_the_talker_cuts_audio_to_its_context_and_fails_only_a_prompt_that_leaves_no_room(
    tiny_checkpoint: Path,
) -> None:
    data = profile_for(tiny_checkpoint).model_dump()
    data["stages"]["talker"]["max_seq_len"] = 128
    eng = await Engine.start(parse_profile(data))
    try:
        long_user = [ChatMessage("user", (TextPart("the sea and the wind " * 40),))]
        no_room = replace(request(eng, 0, talker_tokens=20), prompt=eng.build_prompt(long_user))
        # the servers refuse such a prompt up front (400 context_length_exceeded): the engine's limit
        # is the talker's room, not only the thinker's context
        assert eng.info.max_prompt_tokens == 128 - TALKER_PROMPT_EXTRA
        assert len(no_room.prompt.input_ids) > eng.info.max_prompt_tokens
        capped, fine = request(eng, 0, talker_tokens=200), request(eng, 2, talker_tokens=20)
        (_, bad), (capped_outs, cut), (ok_outs, ok) = await asyncio.gather(
            collect(eng, no_room), collect(eng, capped), collect(eng, fine)
        )
        assert bad.finish_reason == "error" and "no room for audio" in (bad.error or "")
        # cut at the talker's context like the thinker's answers: less than 200 frames, not an error
        assert cut.finish_reason == "length"
        assert 0 < audio_of(capped_outs).size < 200 * 1920
        assert ok.finish_reason == "length" and audio_of(ok_outs).size > 0
        await wait_idle(eng)
    finally:
        await eng.close()
