"""The staged engine against transformers' own generate(), on the tiny checkpoint."""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from omnivoice.config import parse_profile
from omnivoice.engine.engine import RESTARTING, STOPPED, Engine
from omnivoice.types import TALKER_PROMPT_EXTRA, AudioChunk, ChatMessage, Finished, TextPart
from tests.support.engine import (
    AUDIO_FRAMES,
    THINKER_TOKENS,
    audio_of,
    collect,
    profile_for,
    request,
    streaming,
    tokens_of,
    wait_idle,
)
from tests.support.polling import until
from tests.support.reference import reference_generate


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
            reference_model.model, reference_model.spec, req.prompt, "ethan", THINKER_TOKENS, AUDIO_FRAMES + 1
        )
        assert tokens_of(outs) == ref_ids
        assert fin.finish_reason == "length"
        assert fin.usage.completion_tokens == THINKER_TOKENS
        # generate() counts the talker's steps: N frames take N + 1 (the last one's token never speaks)
        assert fin.usage.audio_frames == ref_codes.shape[1] == AUDIO_FRAMES
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
        reference_model.model, reference_model.spec, req.prompt, "ethan", THINKER_TOKENS, AUDIO_FRAMES + 1
    )
    np.testing.assert_allclose(audio_of(outs), ref_wav, rtol=0, atol=1e-5)


async def test_first_audio_arrives_before_the_thinker_finishes(engine: Engine) -> None:
    req = request(engine, 2, thinker_tokens=96, audio_frames=40)
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
        await asyncio.gather(*(collect(engine, request(engine, i, audio_frames=120)) for i in range(4)))
    finally:
        watcher.cancel()
    assert seen["thinker"] >= 2 and seen["talker"] >= 2 and seen["code2wav"] >= 2, seen


async def test_text_only_request_produces_no_audio(engine: Engine) -> None:
    outs, fin = await collect(engine, request(engine, 0, want_audio=False))
    assert not any(isinstance(o, AudioChunk) for o in outs)
    assert len(tokens_of(outs)) == THINKER_TOKENS
    assert fin.finish_reason == "length" and fin.usage.audio_frames == 0


async def test_leaving_the_stream_aborts_the_request_in_every_stage(engine: Engine) -> None:
    req = request(engine, 0, thinker_tokens=200, audio_frames=400)
    gen = engine.generate(req)
    async for out in gen:
        if isinstance(out, AudioChunk):
            break
    await gen.aclose()
    await wait_idle(engine)
    # and the engine still serves
    outs, fin = await collect(engine, request(engine, 2, thinker_tokens=4, audio_frames=10))
    assert fin.finish_reason == "length" and len(tokens_of(outs)) == 4


async def test_abort_by_id_finishes_the_stream(engine: Engine) -> None:
    req = request(engine, 0, thinker_tokens=200, audio_frames=400)
    outs: list = []

    async def consume() -> None:
        async for out in engine.generate(req):
            outs.append(out)

    task = asyncio.create_task(consume())
    await until(lambda: any(isinstance(o, AudioChunk) for o in outs), what="the first audio")
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
        task, outs = await streaming(eng, request(eng, 0, thinker_tokens=200, audio_frames=400))
        talker = next(p for p in eng._pipeline.processes if "-talker-" in p.name)
        os.kill(talker.pid, signal.SIGKILL)
        await asyncio.wait_for(task, 10)
        assert isinstance(outs[-1], Finished) and outs[-1].finish_reason == "error"
        # clients are told the engine stopped, not which process died how (that is for the log)
        assert outs[-1].error == eng.failure == RESTARTING
        with pytest.raises(RuntimeError, match="restarting"):
            await collect(eng, request(eng, 2))
        # the supervisor brings fresh stages up and the next requests succeed
        await until(lambda: eng.failure is None, 90, what="the stages restarted")
        outs, fin = await collect(eng, request(eng, 2, thinker_tokens=4, audio_frames=10))
        assert fin.finish_reason == "length" and len(tokens_of(outs)) == 4
        # once the server shuts down (its drain holds restarts), a dead worker is not brought back
        eng.hold_restarts()
        pipeline = eng._pipeline
        thinker = next(p for p in pipeline.processes if "-thinker-" in p.name)
        os.kill(thinker.pid, signal.SIGKILL)
        await until(lambda: eng.failure is not None, 30, what="the dead thinker noticed")
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
        no_room = replace(request(eng, 0, audio_frames=20), prompt=eng.build_prompt(long_user))
        # the servers refuse such a prompt up front (400 context_length_exceeded): the engine's limit
        # is the talker's room, not only the thinker's context
        assert eng.info.max_prompt_tokens == 128 - TALKER_PROMPT_EXTRA
        assert len(no_room.prompt.input_ids) > eng.info.max_prompt_tokens
        capped, fine = request(eng, 0, audio_frames=200), request(eng, 2, audio_frames=20)
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
