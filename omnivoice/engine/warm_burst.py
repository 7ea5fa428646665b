"""Before serving: one burst of short requests through every stage, as wide as the thinker's batch.

The first time a stage prefills a full batch of prompts it pays costs that later bursts do not: the
CUDA caching allocator grows its pools to the burst's working set, and the libraries pick and set up
kernels for the new shapes. Captured CUDA graphs cover the decode steps but not the prefill, so
without this the first wave of real users pays for them, in a first prefill step many times slower
than the later ones (BENCHMARKS.md has the figures). The burst's requests are
chat prompts of random text ids, as long as the thinker prefills in one step allows (at most 256
tokens each), two text tokens and one audio chunk each; their outputs are dropped.

A burst that runs out of GPU memory (the stages load side by side, and on a tight card the last to
build may find too little left for its widest steps) runs again at half its width, down to one
request. The width that went through is what the engine then serves at most (`Engine.narrow`): a
start on too small a card serves fewer streams, with a warning, rather than none. A failure of any
other kind fails the start.
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


def burst_width(stages: StagesConfig) -> int:
    """The narrower of the thinker and the talker batches (Code2Wav steps its own max_batch of a
    burst's requests at a time)."""
    return min(stages.thinker.max_batch, stages.talker.max_batch)


def burst_requests(
    stages: StagesConfig, spec: ModelSpec, info: ModelInfo, newline_id: int, rows: int | None = None
) -> list[GenerationRequest]:
    """`rows` requests (default: `burst_width`), each prompt as long as the thinker's prefill budget
    for the full width, its context and MAX_PROMPT_TOKENS allow."""
    width = burst_width(stages)
    rows = width if rows is None else rows
    first = stages.code2wav.chunk.first_frames
    # the talker's context keeps room for the frames (a prompt that fills it gets its audio cut)
    room = info.max_prompt_tokens - first - 2
    length = min(MAX_PROMPT_TOKENS, stages.thinker.max_prefill_tokens // width, room)
    body = max(1, length - CHAT_LAYOUT_IDS)
    rng = np.random.default_rng(0)
    return [
        GenerationRequest(
            request_id=f"warm-burst-{i}" if rows == width else f"warm-burst-w{rows}-{i}",
            prompt=chat_prompt(spec, text_ids(spec, body, rng), newline_id),
            voice=info.default_voice,
            thinker=Sampling(max_tokens=2, min_tokens=2),
            talker=Sampling(max_tokens=first, min_tokens=first),  # one first chunk for Code2Wav
        )
        for i in range(rows)
    ]


async def run_requests(engine: EngineAPI, requests: list[GenerationRequest]) -> list[Finished]:
    """Run `requests` side by side to their ends, their outputs dropped; the ends of those that failed."""

    async def one(request: GenerationRequest) -> Finished | None:
        async for out in engine.generate(request):
            if isinstance(out, Finished) and out.finish_reason not in ("stop", "length"):
                return out
        return None

    return [e for e in await asyncio.gather(*(one(r) for r in requests)) if e is not None]


def failure_line(failed: Finished) -> str:
    """One failed request of a burst, for a log line or an error."""
    return f"{failed.request_id}: {failed.finish_reason}: {failed.error}"


def out_of_memory(failed: list[Finished]) -> bool:
    """True when every one of `failed` ran out of GPU memory (a narrower burst may go through)."""
    return all(f.out_of_memory for f in failed)


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


def warm_burst(engine: EngineAPI, stages: StagesConfig, spec: ModelSpec, newline_id: int) -> int:
    """Run the burst to its end, narrower each time it ran out of GPU memory, and return the width
    that went through. Raise RuntimeError if a request of it failed otherwise, or at a width of one."""
    rows = burst_width(stages)
    began = time.perf_counter()
    while True:
        requests = burst_requests(stages, spec, engine.info, newline_id, rows)
        failed = run_apart(run_requests(engine, requests))
        if not failed:
            break
        first = failure_line(failed[0])
        if rows == 1 or not out_of_memory(failed):
            raise RuntimeError(f"the warm-up burst failed ({len(failed)} of {rows}): {first}")
        log.warning(
            "warm-up burst: %d of %d requests ran out of GPU memory (%s); trying %d",
            len(failed), rows, first, rows // 2,
        )  # fmt: skip
        rows //= 2
    log.info(
        "warm-up burst: %d requests of %d prompt tokens through every stage in %.1f s",
        rows,
        len(requests[0].prompt.input_ids),
        time.perf_counter() - began,
    )
    return rows
