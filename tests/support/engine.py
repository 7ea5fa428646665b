"""A real engine in tests: its profile on the tiny checkpoint, requests, and what they give back."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np

from omnivoice.config import Profile, parse_profile
from omnivoice.engine.engine import Engine
from omnivoice.types import (
    AudioChunk,
    AudioPart,
    ChatMessage,
    EngineOutput,
    Finished,
    GenerationRequest,
    Sampling,
    TextDelta,
    TextPart,
)

from .polling import until

THINKER_TOKENS = 24
AUDIO_FRAMES = 69  # several 25-frame chunks after the first 4-frame one


def profile_for(
    checkpoint: Path,
    worker: str = "thread",
    left_context: int = 25,
    max_seq_len: int = 512,
    **sections: dict[str, Any],
) -> Profile:
    """Every stage as `worker` on the tiny checkpoint, 4 requests a batch, `max_seq_len` positions
    each. `sections`: more keys of a section of `stages` (a stage by its name, or `priority`), which
    replace those set here. Chunks keep their sizes (no `catch_up`): where a stream's chunks end then
    does not depend on how fast a loaded test machine runs, so runs can be compared sample by sample.
    What a start keeps (its step times) goes to the checkpoint's cache folder, not the home folder."""
    stage = {"worker": worker, "max_seq_len": max_seq_len, "max_batch": 4}
    chunk = {"first_frames": 4, "frames": 25, "left_context": left_context, "catch_up": False}
    stages: dict[str, dict[str, Any]] = {
        "thinker": stage,
        "talker": stage,
        "code2wav": {**stage, "chunk": chunk},
    }
    for name, keys in sections.items():
        stages[name] = {**stages.get(name, {}), **keys}
    model = {"path": str(checkpoint), "cache_dir": str(checkpoint.parent)}
    return parse_profile({"model": model, "stages": stages})


@asynccontextmanager
async def started(profile: Profile) -> AsyncIterator[Engine]:
    """An engine started on `profile`, closed on the way out."""
    engine = await Engine.start(profile)
    try:
        yield engine
    finally:
        await engine.close()


def messages(i: int) -> list[ChatMessage]:
    """One of three short conversations; the second one's user also speaks (a 1.5 s chirp)."""
    texts = ["hello there, how are you?", "tell me a long story about the sea and the wind", "hi"]
    parts: tuple[TextPart | AudioPart, ...] = (TextPart(texts[i % 3]),)
    if i == 1:  # 1.5 s of a chirp at 16 kHz
        t = np.arange(24000) / 16000
        parts = (AudioPart((0.3 * np.sin(2 * np.pi * (200 + 300 * t) * t)).astype(np.float32), 16000), *parts)
    return [ChatMessage("system", (TextPart("be brief"),)), ChatMessage("user", parts)]


def request(engine: Engine, i: int, want_audio: bool = True, **kw: Any) -> GenerationRequest:
    """Conversation `i` with fixed lengths (`thinker_tokens`, `audio_frames`), greedy, a unique id."""
    thinker = kw.pop("thinker_tokens", THINKER_TOKENS)
    frames = kw.pop("audio_frames", AUDIO_FRAMES)
    return GenerationRequest(
        f"req-{i}-{os.urandom(3).hex()}",
        engine.build_prompt(messages(i)),
        want_audio=want_audio,
        voice="ethan",
        thinker=Sampling(max_tokens=thinker, min_tokens=thinker),
        talker=Sampling(max_tokens=frames, min_tokens=frames, repetition_penalty=1.05),
    )


async def collect(engine: Engine, req: GenerationRequest) -> tuple[list[EngineOutput], Finished]:
    """Every output of `req`, and its `Finished` apart."""
    outs = [o async for o in engine.generate(req)]
    last = outs[-1]
    assert isinstance(last, Finished)
    return outs[:-1], last


def audio_of(outs: list[EngineOutput]) -> np.ndarray:
    """The audio chunks' PCM, joined."""
    chunks = [o.pcm for o in outs if isinstance(o, AudioChunk)]
    return np.concatenate(chunks) if chunks else np.zeros(0, np.float32)


def tokens_of(outs: list[EngineOutput]) -> list[int]:
    """The text deltas' token ids, joined."""
    return [t for o in outs if isinstance(o, TextDelta) for t in o.token_ids]


async def wait_idle(engine: Engine, timeout: float = 5.0) -> None:
    """Until no request is active and every stage reports nothing running or queued."""

    def idle() -> bool:
        st = engine.stats()
        return st.active_requests == 0 and all(s.running == 0 and s.queued == 0 for s in st.stages)

    try:
        await until(idle, timeout, what="the engine going idle")
    except AssertionError as e:
        raise AssertionError(f"{e}: {engine.stats()}") from None


async def streaming(engine: Engine, req: GenerationRequest) -> tuple[asyncio.Task[None], list[EngineOutput]]:
    """`req` consumed in a task of its own, returned once its first audio has come: the task, and the
    list its outputs are appended to (a fault can then be caused mid-answer)."""
    outs: list[EngineOutput] = []

    async def consume() -> None:
        async for out in engine.generate(req):
            outs.append(out)

    task = asyncio.create_task(consume())
    await until(lambda: any(isinstance(o, AudioChunk) for o in outs), what="the first audio")
    return task, outs
