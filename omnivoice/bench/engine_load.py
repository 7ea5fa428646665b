"""Closed-loop load on an in-process `Engine`: no HTTP, token-id prompts, fixed output lengths.

Every request is a random `prompt_tokens`-token user turn in the chat layout built from the model's ids
(so no tokenizer is needed), and writes exactly `text_tokens` text tokens and `audio_frames` codec frames
(min = max tokens in both LMs). It goes through the real staged pipeline: Engine -> Pipeline ->
StageWorkers -> runners. Timing follows vLLM-Omni's definitions (see metrics.py), with the engine's
outputs standing in for SSE chunks: TTFT at the first TextDelta carrying tokens, TTFP at the first
AudioChunk.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

from omnivoice.bench.metrics import RequestRecord
from omnivoice.config import Profile, SamplingDefaults
from omnivoice.models import token_prompt
from omnivoice.models.token_prompt import CHAT_LAYOUT_IDS, text_ids
from omnivoice.types import AudioChunk, Finished, GenerationRequest, Prompt, Sampling, TextDelta

if TYPE_CHECKING:
    from omnivoice.engine.engine import Engine
    from omnivoice.models.loader import ModelSpec

Progress = Callable[[str, int, int, RequestRecord], None]


@dataclass(frozen=True)
class EngineLoadConfig:
    num_prompts: int
    concurrency: int
    warmups: int
    prompt_tokens: int = 128
    text_tokens: int = 64
    audio_frames: int = 240
    voice: str = "ethan"
    seed: int = 0


@dataclass(frozen=True)
class StageFigures:
    """What one stage did during the measured phase, from the workers' published StageStats."""

    name: str
    steps: int
    busy_s: float  # time inside the runner's step()
    mean_step_ms: float | None
    mean_batch: float | None  # last_batch_size sampled every STATS_POLL_S while the stage was busy


@dataclass(frozen=True)
class EngineLoadResult:
    records: list[RequestRecord]
    duration_s: float  # wall time of the measured phase
    stages: tuple[StageFigures, ...] = ()


STATS_POLL_S = 0.05


def chat_prompt(spec: ModelSpec, n_tokens: int, rng: np.random.Generator, newline_id: int) -> Prompt:
    """`<|im_start|>user\\n{random text ids}<|im_end|>\\n<|im_start|>assistant\\n`, n_tokens long in all."""
    body = n_tokens - CHAT_LAYOUT_IDS
    if body < 1:
        raise ValueError(f"a chat prompt needs at least {CHAT_LAYOUT_IDS + 1} tokens, not {n_tokens}")
    return token_prompt.chat_prompt(spec, text_ids(spec, body, rng), newline_id)


def _fixed(d: SamplingDefaults, tokens: int, seed: int | None) -> Sampling:
    return d.for_request(max_tokens=tokens, min_tokens=tokens, seed=seed)


def make_requests(
    profile: Profile, spec: ModelSpec, cfg: EngineLoadConfig, newline_id: int, count: int, tag: str
) -> list[GenerationRequest]:
    """`count` requests with the profile's sampling defaults and fixed lengths; seeded from cfg.seed."""
    rng = np.random.default_rng(cfg.seed)
    stages = profile.stages
    out = []
    for i in range(count):
        seed = cfg.seed * 100_003 + i
        out.append(
            GenerationRequest(
                request_id=f"{tag}-{i}",
                prompt=chat_prompt(spec, cfg.prompt_tokens, rng, newline_id),
                want_audio=cfg.audio_frames > 0,
                voice=cfg.voice,
                thinker=_fixed(stages.thinker.sampling, cfg.text_tokens, seed),
                talker=_fixed(stages.talker.sampling, cfg.audio_frames, seed),
            )
        )
    return out


async def send_one(engine: Engine, request: GenerationRequest) -> RequestRecord:
    """Run one request to its end and time its outputs; failures end up in `record.error`."""
    record = RequestRecord(t0=time.perf_counter())
    try:
        async for out in engine.generate(request):
            now = time.perf_counter()
            if isinstance(out, TextDelta):
                if record.first_text is None and out.token_ids:
                    record.first_text = now
            elif isinstance(out, AudioChunk):
                record.audio_chunks.append((now, len(out.pcm) / out.sample_rate))
                if out.first_audio is not None:
                    record.first_audio_ms = asdict(out.first_audio)
            elif isinstance(out, Finished):
                record.text_tokens = out.usage.completion_tokens
                record.prompt_tokens = out.usage.prompt_tokens
                if out.finish_reason not in ("stop", "length"):
                    record.error = f"{out.finish_reason}: {out.error}"
    except Exception as e:  # a request boundary: every failure is counted, none ends the run
        record.error = f"{type(e).__name__}: {e}"
    record.end = time.perf_counter()
    return record


async def _phase(
    engine: Engine, requests: list[GenerationRequest], concurrency: int, phase: str, progress: Progress | None
) -> list[RequestRecord]:
    records: list[RequestRecord | None] = [None] * len(requests)
    todo = iter(range(len(requests)))  # shared by the workers: each takes the next index when free
    done = 0

    async def worker() -> None:
        nonlocal done
        for i in todo:
            records[i] = record = await send_one(engine, requests[i])
            done += 1
            if progress is not None:
                progress(phase, done, len(requests), record)

    async with asyncio.TaskGroup() as tg:
        for _ in range(min(concurrency, len(requests))):
            tg.create_task(worker())
    return [r for r in records if r is not None]


async def run_engine_load(
    engine: Engine, cfg: EngineLoadConfig, newline_id: int, progress: Progress | None = None
) -> EngineLoadResult:
    """Warm-ups (at most `concurrency` at once, not measured), then the measured closed loop."""
    reqs = make_requests(engine.profile, engine.spec, cfg, newline_id, cfg.warmups + cfg.num_prompts, "bench")
    await _phase(engine, reqs[: cfg.warmups], cfg.concurrency, "warm-up", progress)
    before = {s.name: s for s in engine.stats().stages}
    batches: dict[str, list[int]] = {name: [] for name in before}
    poller = asyncio.create_task(_poll_batches(engine, batches))
    start = time.perf_counter()
    try:
        records = await _phase(engine, reqs[cfg.warmups :], cfg.concurrency, "request", progress)
    finally:
        poller.cancel()
    duration = time.perf_counter() - start
    await asyncio.sleep(2 * STATS_POLL_S)  # let the workers publish their last figures
    stages = []
    for after in engine.stats().stages:
        steps = after.steps - before[after.name].steps
        busy = after.busy_s - before[after.name].busy_s
        seen = batches[after.name]
        stages.append(
            StageFigures(
                after.name,
                steps,
                round(busy, 3),
                round(1000 * busy / steps, 2) if steps else None,
                round(sum(seen) / len(seen), 2) if seen else None,
            )
        )
    return EngineLoadResult(records, duration, tuple(stages))


async def _poll_batches(engine: Engine, batches: dict[str, list[int]]) -> None:
    last_steps: dict[str, int] = {}
    while True:
        for st in engine.stats().stages:
            if st.steps != last_steps.get(st.name, st.steps):  # it stepped since the last poll
                batches[st.name].append(st.last_batch_size)
            last_steps[st.name] = st.steps
        await asyncio.sleep(STATS_POLL_S)
