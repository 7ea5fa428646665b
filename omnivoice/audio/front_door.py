"""The front door: the app-wide scorer of every realtime session's incoming audio (`FrontDoor`).

Each append of a session is a `Job`. With worker threads (`workers` >= 1), a session submits its job
and awaits the result; a free worker takes every job pending at once (a tick), once the oldest has
waited `gather_s` for others to join it (a busy front door's queue is old enough already), and, for
all of them:
1. `take`s each job: converts its audio (base64 or G.711 decoding, resampling: per session) and
   buffers it. A job that raises here (a bad payload, a full buffer) fails alone;
2. scores the new audio of every job's VAD stream together (`score_streams`: one model run per
   32 ms frame step over all the sessions that have that frame);
3. advances every job's log-mel stream together (`advance_streams`: one FFT and one mel product over
   all the new frames);
4. `finish`es each job, and completes the sessions' futures on their event loop, one wake-up per
   tick.
So at a hundred sessions the interpreter overhead of the many small model and tensor calls is paid
once per tick, not once per session and frame, and the event loop only hands jobs over. A session
never has two jobs in flight (it handles its appends in order; a run of them that queued up is one
job), so a tick holds distinct streams.

With `workers` 0 each job runs alone, in its own `asyncio.to_thread` call (the per-session path).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from omnivoice.audio.log_mel import LogMelStream, advance_streams
from omnivoice.audio.vad import VadStream, score_streams

log = logging.getLogger(__name__)

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


@dataclass(frozen=True)
class Scoring:
    """What to score of one append: its new 16 kHz audio for `vad`, and `stream` (None: none) to be
    extended by it and advanced to `safe` samples."""

    pcm: np.ndarray
    vad: VadStream
    stream: LogMelStream | None = None
    safe: int = 0


class Job(Protocol[R_co]):
    """One append. `take` (in a worker) converts and buffers its audio and says what to score of it
    (None: nothing); `finish` (in the worker, after the scoring) makes the result from the speech
    probabilities of its new frames ([] when nothing was scored)."""

    def take(self) -> Scoring | None: ...

    def finish(self, probs: list[float]) -> R_co: ...


@dataclass
class _Pending(Generic[R]):
    job: Job[R]
    future: asyncio.Future[R]
    loop: asyncio.AbstractEventLoop
    queued: float = field(default_factory=time.monotonic)
    scoring: Scoring | None = None
    probs: list[float] = field(default_factory=list)  # of the new frames, once scored
    error: BaseException | None = None
    result: Any = None


class FrontDoor:
    """The scorer shared by the app's sessions, with `workers` threads (0: each job in its own
    `asyncio.to_thread` call); a tick starts once its oldest job has waited `gather_s`. The threads
    start with the first job; `close` stops them."""

    def __init__(self, workers: int = 1, gather_s: float = 0.0) -> None:
        if workers < 0:
            raise ValueError(f"workers must be >= 0, got {workers}")
        self.workers = workers
        self.gather_s = gather_s
        self._queue: list[_Pending[Any]] = []
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._closed = False
        self.ticks = 0  # ticks run, and the jobs they took: jobs / ticks is the mean batch
        self.jobs = 0
        self.busy_s = 0.0  # seconds the workers spent in ticks
        self.waited_s = 0.0  # seconds the jobs waited in the queue, together

    async def score(self, job: Job[R]) -> R:
        """Run `job` (in a worker, with the jobs of other sessions pending at the time); its result,
        or what its `take` or `finish` (or the scoring) raised."""
        if self.workers == 0:
            return await asyncio.to_thread(run_alone, job)
        loop = asyncio.get_running_loop()
        pending: _Pending[R] = _Pending(job, loop.create_future(), loop)
        with self._cond:
            if self._closed:
                raise RuntimeError("the front door is closed")
            if not self._threads:
                self._start()
            self._queue.append(pending)
            self._cond.notify()
        return await pending.future

    def _start(self) -> None:
        for i in range(self.workers):
            thread = threading.Thread(target=self._work, name=f"front-door-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _work(self) -> None:
        while self._tick():
            pass

    def _tick(self) -> bool:
        """Run the next tick (False: closed). Its jobs are this call's alone, so an idle worker holds
        none of them, nor the sessions behind them."""
        batch = self._take()
        if batch is None:
            return False
        t0 = time.monotonic()
        try:
            tick(batch)
        except Exception as e:  # the scoring itself failed: every job of the tick with it
            log.exception("the front door failed a tick of %d jobs", len(batch))
            for p in batch:
                p.error = p.error or e
        _complete(batch)
        with self._cond:
            self.busy_s += time.monotonic() - t0
        return True

    def _take(self) -> list[_Pending[Any]] | None:
        """The next tick's jobs, once the oldest has waited `gather_s`; None once closed."""
        with self._cond:
            while not self._closed:
                wait = self._queue[0].queued + self.gather_s - time.monotonic() if self._queue else None
                if wait is not None and wait <= 0:
                    break
                self._cond.wait(wait)
            if self._closed:
                return None
            batch, self._queue = self._queue, []
            now = time.monotonic()
            self.ticks += 1
            self.jobs += len(batch)
            self.waited_s += sum(now - p.queued for p in batch)
            return batch

    async def close(self) -> None:
        """Stop the workers (after the tick under way); jobs still queued fail (RuntimeError), as do
        those submitted later."""
        with self._cond:
            self._closed = True
            queued, self._queue = self._queue, []
            self._cond.notify_all()
        for p in queued:
            p.error = RuntimeError("the front door is closed")
        _complete(queued)
        threads, self._threads = self._threads, []
        for thread in threads:
            await asyncio.to_thread(thread.join)


def run_alone(job: Job[R]) -> R:
    """Run one job by itself: its VAD frame by frame and its log-mel stream alone (the per-session
    path, and the reference the batched one equals)."""
    scoring = job.take()
    if scoring is None:
        return job.finish([])
    if scoring.stream is not None:
        scoring.stream.extend(scoring.pcm)
        scoring.stream.advance(scoring.safe)
    return job.finish(scoring.vad.process(scoring.pcm))


def tick(batch: list[_Pending[Any]]) -> None:
    """Take, score and finish every job of `batch` (each one's result or error is set on it)."""
    for p in batch:
        try:
            p.scoring = p.job.take()
        except Exception as e:
            p.error = e
    scored = [(p, p.scoring) for p in batch if p.scoring is not None]
    models: dict[Any, list[tuple[_Pending[Any], Scoring]]] = {}
    for p, s in scored:
        models.setdefault(s.vad.model, []).append((p, s))
    for model, group in models.items():
        probs = score_streams(model, [(s.vad, s.pcm) for _, s in group])
        for (p, _), ps in zip(group, probs, strict=True):
            p.probs = ps
    for _, s in scored:
        if s.stream is not None:
            s.stream.extend(s.pcm)
    advance_streams([(s.stream, s.safe) for _, s in scored if s.stream is not None])
    for p in batch:
        if p.error is None:
            try:
                p.result = p.job.finish(p.probs)
            except Exception as e:
                p.error = e


def _complete(batch: list[_Pending[Any]]) -> None:
    """Hand the results to their event loops, one callback per loop."""
    loops: dict[asyncio.AbstractEventLoop, list[_Pending[Any]]] = {}
    for p in batch:
        loops.setdefault(p.loop, []).append(p)
    for loop, done in loops.items():
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody awaits these
            loop.call_soon_threadsafe(_resolve, done)


def _resolve(done: list[_Pending[Any]]) -> None:
    for p in done:
        if p.future.done():  # the session went away meanwhile
            continue
        if p.error is not None:
            p.future.set_exception(p.error)
        else:
            p.future.set_result(p.result)
