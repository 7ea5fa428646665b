"""The engine's audio path against transformers' generate(), on the tiny checkpoint: clips of several
lengths from concurrent requests encoded together and spread over steps (a budget of two windows a
step), and a spoken turn featurized while it was spoken and encoded ahead window by window, all give
transformers' greedy tokens."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import numpy as np
import pytest

from omnivoice.engine.engine import Engine
from omnivoice.types import AudioPart, ChatMessage, GenerationRequest, Prompt, Sampling, StageStats, TextPart
from tests.support.engine import collect, profile_for, started, tokens_of
from tests.support.polling import until
from tests.support.reference import reference_generate

TOKENS = 8
RATE = 16000


@pytest.fixture
async def engine(tiny_checkpoint: Path):
    profile = profile_for(tiny_checkpoint, max_seq_len=1024, thinker={"audio_windows_per_step": 2})
    async with started(profile) as eng:
        yield eng


def noise(seconds: float, seed: int) -> np.ndarray:
    return (0.1 * np.random.default_rng(seed).standard_normal(int(seconds * RATE))).astype(np.float32)


def request(prompt: Prompt, cache_key: str | None = None) -> GenerationRequest:
    sampling = Sampling(max_tokens=TOKENS, min_tokens=TOKENS)
    rid = f"audio-{os.urandom(3).hex()}"
    return GenerationRequest(rid, prompt, want_audio=False, thinker=sampling, cache_key=cache_key)


def reference_tokens(reference_model, prompt: Prompt) -> list[int]:
    ids, _, _ = reference_generate(reference_model.model, reference_model.spec, prompt, "ethan", TOKENS, 2)
    return ids


async def test_clips_of_concurrent_requests_encoded_together_match_transformers(
    engine: Engine, reference_model
) -> None:
    # under a chunk (encoded as transformers encodes a clip alone), a chunk and a half, two windows and
    # a tail, and two clips in one prompt
    clips = [(0.6,), (1.5,), (17.3,), (1.2, 2.4)]
    prompts = [
        engine.build_prompt(
            [ChatMessage("user", (*(AudioPart(noise(s, n), RATE) for s in seconds), TextPart("what is it?")))]
        )
        for n, seconds in enumerate(clips)
    ]
    results = await asyncio.gather(*(collect(engine, request(p)) for p in prompts))
    for prompt, (outs, fin) in zip(prompts, results, strict=True):
        assert fin.finish_reason == "length"
        assert tokens_of(outs) == reference_tokens(reference_model, prompt)


async def test_a_turn_encoded_ahead_while_spoken_matches_transformers(
    engine: Engine, reference_model
) -> None:
    window = engine.info.audio_window_frames
    pcm = noise(19.0, seed=7)
    stream = engine.log_mel.stream()
    sent = 0
    for at in range(0, pcm.size, 1600):  # 100 ms at a time, as a caller speaks
        stream.extend(pcm[at : at + 1600])
        stream.advance(at)
        while stream.frames >= (sent + 1) * window:
            engine.encode_ahead("caller", [stream.features(sent * window, (sent + 1) * window)])
            sent += 1
    assert sent == 2
    features = stream.finish(pcm)  # the turn ends: only its last frames are computed now
    prompt = engine.build_prompt([ChatMessage("user", (AudioPart(pcm, RATE, features), TextPart("and?")))])
    outs, _ = await collect(engine, request(prompt, cache_key="caller"))
    assert tokens_of(outs) == reference_tokens(reference_model, prompt)

    def thinker() -> StageStats:
        return next(s for s in engine.stats().stages if s.name == "thinker")

    await until(lambda: thinker().audio_windows == 3, what="the thinker's figures")
    assert thinker().audio_windows_ahead == 2  # only the tail was encoded at the turn's end
    engine.forget("caller")
