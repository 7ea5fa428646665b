"""Before serving: one burst of short requests through every stage, as wide as the thinker's batch.

The first time a stage prefills a full batch of prompts it pays costs that later bursts do not: the
CUDA caching allocator grows its pools to the burst's working set, and the libraries pick and set up
kernels for the new shapes. Captured CUDA graphs cover the decode steps but not the prefill, so
without this the first wave of real users pays for them, in a first prefill step many times slower
than the later ones (BENCHMARKS.md has the figures). The burst's requests are
chat prompts of random text ids, as long as the thinker prefills in one step allows (at most 256
tokens each), two text tokens and one audio chunk each; their outputs are dropped.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import numpy as np

from omnivoice.config import StagesConfig
from omnivoice.engine.api import EngineAPI
from omnivoice.models.loader import ModelSpec
from omnivoice.models.token_prompt import CHAT_LAYOUT_IDS, chat_prompt, text_ids
from omnivoice.types import Finished, GenerationRequest, ModelInfo, Sampling

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_PROMPT_TOKENS = 256  # past this the burst's shapes are bigger than a voice turn's


def burst_requests(
    stages: StagesConfig, spec: ModelSpec, info: ModelInfo, newline_id: int
) -> list[GenerationRequest]:
    """As many requests as the narrower of the thinker and the talker batches (Code2Wav steps its own
    max_batch of them at a time), each prompt as long as the thinker's prefill budget, its context and
    MAX_PROMPT_TOKENS allow."""
    rows = min(stages.thinker.max_batch, stages.talker.max_batch)
    first = stages.code2wav.chunk.first_frames
    # the talker's context keeps room for the frames (a prompt that fills it gets its audio cut)
    room = info.max_prompt_tokens - first - 2
    length = min(MAX_PROMPT_TOKENS, stages.thinker.max_prefill_tokens // rows, room)
    body = max(1, length - CHAT_LAYOUT_IDS)
    rng = np.random.default_rng(0)
    return [
        GenerationRequest(
            request_id=f"warm-burst-{i}",
            prompt=chat_prompt(spec, text_ids(spec, body, rng), newline_id),
            voice=info.default_voice,
            thinker=Sampling(max_tokens=2, min_tokens=2),
            talker=Sampling(max_tokens=first, min_tokens=first),  # one first chunk for Code2Wav
        )
        for i in range(rows)
    ]


async def run_requests(engine: EngineAPI, requests: list[GenerationRequest]) -> list[str]:
    """Run `requests` side by side to their ends, their outputs dropped; what failed, one line each."""

    async def one(request: GenerationRequest) -> str | None:
        async for out in engine.generate(request):
            if isinstance(out, Finished) and out.finish_reason not in ("stop", "length"):
                return f"{request.request_id}: {out.finish_reason}: {out.error}"
        return None

    return [e for e in await asyncio.gather(*(one(r) for r in requests)) if e is not None]


def run_apart(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(coro)` on a thread of its own (the caller may be inside an event loop), its
    result returned or its exception raised here."""
    out: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(asyncio.run(coro))
        except BaseException as e:  # raised in the caller's thread below, not lost in this one
            errors.append(e)

    thread = threading.Thread(target=run, name="run-apart")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return out[0]


def warm_burst(engine: EngineAPI, stages: StagesConfig, spec: ModelSpec, newline_id: int) -> None:
    """Run the burst to its end; raise RuntimeError if any request of it failed."""
    requests = burst_requests(stages, spec, engine.info, newline_id)
    began = time.perf_counter()
    failed = run_apart(run_requests(engine, requests))
    if failed:
        raise RuntimeError(f"the warm-up burst failed ({len(failed)} of {len(requests)}): {failed[0]}")
    log.info(
        "warm-up burst: %d requests of %d prompt tokens through every stage in %.1f s",
        len(requests),
        len(requests[0].prompt.input_ids),
        time.perf_counter() - began,
    )
