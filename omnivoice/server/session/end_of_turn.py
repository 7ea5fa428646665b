"""The end-of-turn model behind `semantic_vad`, shared by the app's sessions (`Sessions.judge`).

A session whose speech pauses asks `TurnJudge.score` how likely it is that the caller is done, with
the turn's audio up to the pause. The model (audio/smart_turn.py) runs off the event loop, in worker
threads, up to `runs` runs at once. A pause asked while a run is free starts one; the pauses that
ask while every run is busy go together into the next free run, as one batch, and the pauses waiting
are split evenly over the runs that are free: a run's cost grows with its batch, so at a hundred
callers several runs share the work, and a pause waits at most for one run before its own. The model
is loaded once, off the event loop too, when the first session turns `semantic_vad` on (`prepare`)
or at the first pause.
`stats` (exported on /metrics) time every pause from its question to its answer.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from omnivoice.audio.smart_turn import SmartTurn
from omnivoice.types import count_into

log = logging.getLogger(__name__)

MAX_BATCH = 32  # pauses per model run; more wait for the next run
# upper bounds (seconds) of the pause-latency histogram's buckets
LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0)


@dataclass
class JudgeStats:
    """Every pause scored since the app started: how long each waited for its answer (queue, features
    and model, as `latency_buckets` counts per LATENCY_BUCKETS bound, and their sum), the model's
    runs and the pauses they took, and how many ended their turn (`done`) or held it open."""

    pauses: int = 0
    latency_sum_s: float = 0.0
    latency_buckets: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS))
    runs: int = 0
    run_seconds: float = 0.0
    done: int = 0
    held: int = 0
    failed: int = 0

    def record(self, latency_s: float) -> None:
        self.pauses += 1
        self.latency_sum_s += latency_s
        count_into(self.latency_buckets, LATENCY_BUCKETS, latency_s)


Pending = tuple[np.ndarray, "asyncio.Future[float]", float]  # clip, its answer, when it was asked


def auto_runs(cores: int | None = None) -> int:
    """Runs at once by default: one per four cores (the rest serve the stages and the front door)."""
    return max(1, (cores or os.cpu_count() or 1) // 4)


class TurnJudge:
    """`load` makes the model (in a worker thread; default: Smart Turn with `threads` intra-op
    threads); `runs`: model runs at once (0: `auto_runs`)."""

    def __init__(self, threads: int = 1, load: Callable[[], SmartTurn] | None = None, runs: int = 1) -> None:
        self._load_model = load or (lambda: SmartTurn(threads=threads))
        self.runs = runs or auto_runs()
        self._model: SmartTurn | None = None
        self._loading: asyncio.Task[SmartTurn] | None = None
        self._pending: list[Pending] = []
        self._runner: asyncio.Task[None] | None = None
        self._busy = 0  # runs under way
        self._freed = asyncio.Event()  # set when a run ends
        self._batches: set[asyncio.Task[None]] = set()
        self.stats = JudgeStats()

    def prepare(self) -> None:
        """Start loading the model in the background, if it is not loaded or loading."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no event loop (settings made outside one): the first pause loads it
            return
        if self._model is None and self._loading is None:
            self._loading = asyncio.create_task(asyncio.to_thread(self._load), name="turn-model-load")

    def _load(self) -> SmartTurn:
        t0 = time.perf_counter()
        model = self._load_model()
        log.info("end-of-turn model loaded in %.2f s", time.perf_counter() - t0)
        return model

    async def model(self) -> SmartTurn:
        """The model, loaded once (a failed load is tried again on the next call)."""
        if self._model is None:
            self.prepare()
            assert self._loading is not None
            try:
                self._model = await asyncio.shield(self._loading)
            except Exception:
                self._loading = None
                raise
        return self._model

    async def score(self, clip: np.ndarray) -> float:
        """The probability that the turn whose audio (16 kHz float32) ends `clip` is done. Raises what
        the model raised (the session then waits for its ceiling)."""
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._pending.append((clip, future, time.perf_counter()))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run(), name="turn-model")
        return await future

    async def _run(self) -> None:
        """Hand the pending pauses to free runs, split evenly over them, until none is left."""
        while self._pending:
            if self._busy >= self.runs:
                self._freed.clear()
                await self._freed.wait()
                continue
            size = min(MAX_BATCH, math.ceil(len(self._pending) / (self.runs - self._busy)))
            batch, self._pending = self._pending[:size], self._pending[size:]
            batch = [b for b in batch if not b[1].done()]  # a session gone meanwhile: not scored
            if not batch:
                continue
            self._busy += 1
            task = asyncio.create_task(self._score(batch), name="turn-model-run")
            self._batches.add(task)
            task.add_done_callback(self._batches.discard)

    async def _score(self, batch: list[Pending]) -> None:
        """One model run over `batch`, each pause answered with its probability or the model's error."""
        t0 = time.perf_counter()
        try:
            model = await self.model()
            probs = await asyncio.to_thread(model.score, [clip for clip, _, _ in batch])
        except Exception as e:
            log.warning("the end-of-turn model failed on %d pauses", len(batch), exc_info=True)
            self.stats.failed += len(batch)
            for _, future, _ in batch:
                if not future.done():
                    future.set_exception(e)
            return
        finally:
            self._busy -= 1
            self._freed.set()
        now = time.perf_counter()
        self.stats.runs += 1
        self.stats.run_seconds += now - t0
        for (_, future, asked), prob in zip(batch, probs, strict=True):
            self.stats.record(now - asked)
            if not future.done():
                future.set_result(prob)

    def count(self, done: bool) -> None:
        """A session acted on a score: its turn ended at the pause (`done`) or was held open."""
        if done:
            self.stats.done += 1
        else:
            self.stats.held += 1

    async def close(self) -> None:
        """Stop the runner (the app is shutting down); pauses still waiting fail."""
        tasks = [t for t in (self._runner, self._loading, *self._batches) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for _, future, _ in self._pending:
            future.cancel()
        self._pending = []
