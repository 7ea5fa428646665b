"""Before serving: measure what the stages serve, so that admission knows the machine from its first
request.

Measured admission (engine/capacity.py) fits each stage's step time against its batch size from the
steps it has run. A fresh server has run none; left alone it would learn its capacity from its first
users, one narrow batch at a time, and refuse the rest meanwhile (a figure fitted to one small batch
is cautious, and trusted only up to twice that batch). So the engine runs one short burst at each
batch bucket (1, 2, 4, ... up to the narrower of the thinker's and talker's max_batch) through every
stage, long enough that each stage times several decode steps at each size (and `capacity.min_steps`
in all; Code2Wav steps at most its own max_batch of them at once); the
workers report those step times with their stats and the capacity is fitted to them. Real traffic
then refines it: each size keeps the median of its latest steps, so served steps replace the
calibration's. A start of the same model, stage settings, torch version and devices uses the last
calibration's step times instead of running the bursts again (engine/kept_calibration.py).

A stage that left the graphs of its wide batches for after the start (`graphs_at_start`) captures one
whenever a step first needs it, and keeps that step out of its step times. Code2Wav's window changes
shape from chunk to chunk, so in the first burst of a wide size nearly every one of its steps captured
a graph and none was timed; its capacity would then be capped at twice its widest timed size. So the
bursts of the sizes past what such a stage timed run again (at most REPEATS times), on the graphs the
first run captured.

A burst that runs out of GPU memory (every request of it that failed did) ends the calibration at the
sizes before it, and the engine then serves at most the widest of those (`Engine.narrow`, as after a
warm-up burst that ran out: engine/warm_burst.py); at the first size, or failing otherwise, it fails
the start.

The burst's requests are chat prompts of random text ids, a few text tokens and a few Code2Wav
chunks of audio each; their outputs are dropped.
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np

from omnivoice.config import StagesConfig
from omnivoice.engine.api import EngineAPI
from omnivoice.engine.capacity import MIN_SIZE_STEPS
from omnivoice.engine.warm_burst import burst_width, failure_line, out_of_memory, run_apart, run_requests
from omnivoice.models.loader import ModelSpec
from omnivoice.models.token_prompt import chat_prompt, text_ids
from omnivoice.runners.graphs import power_buckets
from omnivoice.types import TALKER_PROMPT_EXTRA, Capacity, GenerationRequest, ModelInfo, Sampling, StageStats

log = logging.getLogger(__name__)

PROMPT_BODY = 24  # text ids of each prompt: a short question (the prefill is not what is measured)
STATS_WAIT_S = 5.0  # how long the workers' figures of the last burst may take to reach the engine
REPEATS = 2  # times the bursts of sizes a stage with graphs left for later did not time may run again


def calibration_sizes(stages: StagesConfig, widest: int | None = None) -> tuple[int, ...]:
    """The burst sizes: powers of two up to the narrower language model's max_batch (or `widest`, the
    engine's width when its start narrowed it), and it. Code2Wav steps at most its own max_batch of a
    burst's streams at once, whatever the burst."""
    return power_buckets(widest or burst_width(stages))


def step_widths(stages: StagesConfig) -> dict[str, int]:
    """The most requests a step of each stage takes."""
    return {s: stages.stage(s).max_batch for s in ("thinker", "talker", "code2wav")}


def chunk_frames(stages: StagesConfig, chunks: int) -> int:
    """Frames of audio that make `chunks` Code2Wav chunks (the first, then ramped or whole chunks)."""
    c = stages.code2wav.chunk
    size, total = c.first_frames, 0
    for _ in range(chunks):
        total += size
        size = min(2 * size, c.frames) if c.ramp else c.frames
    return total


def calibration_requests(
    stages: StagesConfig,
    spec: ModelSpec,
    info: ModelInfo,
    newline_id: int,
    size: int,
    tag: str = "",
    widest: int | None = None,
) -> list[GenerationRequest]:
    """`size` requests whose decode steps each stage runs side by side: enough steps per stage that
    every size counts (MIN_SIZE_STEPS) and all sizes (up to `widest`) together reach
    `capacity.min_steps`."""
    sizes = len(calibration_sizes(stages, widest))
    per_size = max(MIN_SIZE_STEPS + 1, math.ceil(stages.capacity.min_steps / sizes) + 1)
    tokens = per_size + 1  # the first comes from the prefill step, which is not counted
    rng = np.random.default_rng(size)
    prompt = chat_prompt(spec, text_ids(spec, PROMPT_BODY, rng), newline_id)
    room = stages.talker.max_seq_len - len(prompt.input_ids) - TALKER_PROMPT_EXTRA
    frames = max(stages.code2wav.chunk.first_frames, min(chunk_frames(stages, per_size), room))
    return [
        GenerationRequest(
            request_id=f"calibrate{tag}-{size}-{i}",
            prompt=prompt,
            voice=info.default_voice,
            thinker=Sampling(max_tokens=tokens, min_tokens=tokens),
            talker=Sampling(max_tokens=frames, min_tokens=frames),
        )
        for i in range(size)
    ]


def widest_timed(worker: StageStats) -> int:
    """The widest batch size a worker has timed enough steps of to count (0: none)."""
    return max((b for b, _, n in worker.step_times if n >= MIN_SIZE_STEPS), default=0)


def sizes_to_repeat(
    sizes: tuple[int, ...],
    backlogged: set[tuple[str, int]],
    workers: tuple[StageStats, ...],
    widths: dict[str, int],
) -> tuple[int, ...]:
    """The calibrated sizes whose steps some worker of `backlogged` (the workers that had graphs left
    for after the start) has not timed: past its widest timed size, up to its stage's widest step
    (`widths`)."""
    return tuple(
        s
        for s in sizes
        if any(widest_timed(w) < min(s, widths[w.name]) for w in workers if (w.name, w.replica) in backlogged)
    )


def _bursts(
    engine: EngineAPI,
    stages: StagesConfig,
    spec: ModelSpec,
    newline_id: int,
    sizes: tuple[int, ...],
    tag: str,
    widest: int | None,
) -> int | None:
    """Run the bursts of `sizes` in turn, up to the first that runs out of GPU memory: its size, or
    None when all went through. RuntimeError if a burst failed otherwise."""
    for size in sizes:
        requests = calibration_requests(stages, spec, engine.info, newline_id, size, tag, widest)
        failed = run_apart(run_requests(engine, requests))
        if not failed:
            continue
        why = f"the calibration burst of {size} failed ({len(failed)}): {failure_line(failed[0])}"
        if not out_of_memory(failed):
            raise RuntimeError(why)
        log.warning("calibration: %s", why)
        return size
    return None


def _below(sizes: tuple[int, ...], failed: int | None) -> tuple[int, ...]:
    """The calibrated `sizes` narrower than the burst that ran out of memory (`failed`; None: all);
    RuntimeError if there are none."""
    if failed is None:
        return sizes
    fit = tuple(s for s in sizes if s < failed)
    if not fit:
        raise RuntimeError(f"the calibration's narrowest burst ({failed}) ran out of GPU memory")
    log.warning("calibration: calibrated up to %d, the widest that GPU memory allows", fit[-1])
    return fit


def _backlogged(engine: EngineAPI) -> set[tuple[str, int]]:
    """The workers that report graphs left for after the start, by (stage, replica)."""
    return {(w.name, w.replica) for w in engine.replica_stats() if w.graphs_pending}


def _reported(engine: EngineAPI) -> Capacity:
    """The capacity once every stage has a figure and every worker has reported itself idle (its step
    times then include the last burst's steps), or after STATS_WAIT_S."""
    deadline = time.monotonic() + STATS_WAIT_S
    while True:
        capacity = engine.capacity()
        idle = all(w.running == 0 and w.queued == 0 for w in engine.replica_stats())
        if (idle and all(n is not None for _, n in capacity.stages)) or time.monotonic() >= deadline:
            return capacity
        time.sleep(0.05)  # the workers report at once when they go idle; the dispatcher hands it on


def calibrate(
    engine: EngineAPI, stages: StagesConfig, spec: ModelSpec, newline_id: int, widest: int | None = None
) -> int:
    """Run one burst per batch size up to `widest` (default: `burst_width`; again for the sizes a
    stage with graphs left for later did not time), wait for the stages' figures (the log says the
    capacity fitted to them), and return the widest burst that went through (narrower than asked
    when a wider one ran out of GPU memory); raise RuntimeError if a burst failed otherwise, or the
    first."""
    began = time.perf_counter()
    backlogged = _backlogged(engine)
    sizes = calibration_sizes(stages, widest)
    sizes = _below(sizes, _bursts(engine, stages, spec, newline_id, sizes, "", widest))
    capacity = _reported(engine)
    backlogged |= _backlogged(engine)
    for round_ in range(1, REPEATS + 1):
        again = sizes_to_repeat(sizes, backlogged, engine.replica_stats(), step_widths(stages))
        if not again:
            break
        log.info(
            "calibration: a stage captured graphs in its steps at batch sizes %s and timed too few; "
            "running them again (%d of %d)",
            ",".join(map(str, again)),
            round_,
            REPEATS,
        )
        failed = _bursts(engine, stages, spec, newline_id, again, f"-again{round_}", widest)
        capacity = _reported(engine)
        if failed is not None:  # a repeat ran out of memory where the first run had not
            sizes = _below(sizes, failed)
            break
    log.info(
        "capacity calibrated in %.1f s at batch sizes %s: %s real-time audio streams (%s)",
        time.perf_counter() - began,
        ",".join(map(str, sizes)),
        capacity.streams,
        ", ".join(f"{name} {n}" for name, n in capacity.stages),
    )
    return sizes[-1]
