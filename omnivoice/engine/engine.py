"""Engine: the asyncio face of the staged pipeline.

    generate(request) -> async iterator of TextDelta | AudioChunk | Finished;  abort(id)

Stage workers run in threads or processes; one dispatcher thread (engine/dispatch.py) reads what they
send back and hands it to the request's asyncio queue, and watches that the workers are well. Leaving
the iterator early aborts the request everywhere.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from omnivoice.config import Profile
from omnivoice.engine.calibration import calibrate
from omnivoice.engine.capacity import engine_capacity
from omnivoice.engine.detokenizer import IncrementalDetokenizer
from omnivoice.engine.device_fault import exit_soon
from omnivoice.engine.dispatch import RESTARTING, STOPPED, Dispatch
from omnivoice.engine.kept_calibration import KeptCalibration
from omnivoice.engine.leftovers import reclaim
from omnivoice.engine.loading import ServedModel, load_served_model
from omnivoice.engine.model_front import ModelFront
from omnivoice.engine.pipeline import Pipeline
from omnivoice.engine.process_start import start_forkserver
from omnivoice.engine.request_state import RequestState, Sink, queue_sink
from omnivoice.engine.start_progress import StartProgress
from omnivoice.engine.start_record import start_record
from omnivoice.engine.stuck import ProgressWatch
from omnivoice.engine.supervisor import Supervisor
from omnivoice.engine.warm_burst import burst_width, run_apart, warm_burst
from omnivoice.messages import Abort, EncodeAhead, ForgetPrefix, NewRequest, TimeSteps
from omnivoice.models.dummy import DummySource
from omnivoice.models.token_prompt import newline_id
from omnivoice.models.tool_calls import call_grammar
from omnivoice.runners.start_steps import StartSteps
from omnivoice.types import (
    STAGES,
    Capacity,
    EngineOutput,
    EngineOverloaded,
    EngineStats,
    EngineUnavailable,
    Finished,
    GenerationRequest,
    StageStats,
)

log = logging.getLogger(__name__)

__all__ = ["RESTARTING", "STOPPED", "Engine"]


class Engine(ModelFront, Dispatch):
    core_pid: int | None = None  # the core is this process (EngineAPI.core_pid)

    def __init__(self, profile: Profile, model: ServedModel, pipeline: Pipeline):
        ModelFront.__init__(self, profile, model)
        self._pipeline = pipeline
        self._supervisor = Supervisor(profile, model.source)
        self._requests: dict[str, RequestState] = {}
        self._lock = threading.Lock()
        self._progress = ProgressWatch(profile.stages.stuck_after_s)
        self._stage_stats = {}  # no worker has reported yet
        self._reset_routing()
        self._closed = False
        # requests one replica of each stage may hold (running + waiting); more are refused at once
        stages = [profile.stages.stage(s) for s in STAGES]
        self._capacity = tuple(s.max_batch + s.max_queue for s in stages)
        self.narrowed: int | None = None  # `narrow`: the widest start-up burst that GPU memory allowed
        # what one step must keep up with, per request: a frame of audio (the thinker's text: one token
        # per frame), or a chunk of frames (Code2Wav)
        frame_s = 1.0 / model.spec.frame_rate
        chunk = profile.stages.code2wav.chunk.frames
        self._step_budgets = {"thinker": frame_s, "talker": frame_s, "code2wav": chunk * frame_s}
        # Code2Wav's streams take turns in its steps (a window each per chunk), at most max_batch a step
        self._rows_per_step = {"code2wav": profile.stages.code2wav.max_batch}
        self.failure: str | None = None  # set when a stage worker died; the engine then refuses work
        # what a device fault in a stage of this process does: end the process (device_fault.exit_soon)
        self.on_device_fault: Callable[[str], None] = exit_soon
        self._dispatcher = threading.Thread(target=self._dispatch_loop, name="engine-dispatch", daemon=True)
        self._dispatcher.start()

    @classmethod
    async def start(
        cls,
        profile: Profile,
        source: Path | DummySource | None = None,
        progress: StartProgress | None = None,
    ) -> Engine:
        return await asyncio.to_thread(cls.start_sync, profile, source, progress)

    @classmethod
    def start_sync(
        cls,
        profile: Profile,
        source: Path | DummySource | None = None,
        progress: StartProgress | None = None,
    ) -> Engine:
        """Start the stages of `profile` on `source` (default: the profile's model.path). `progress`:
        where the steps of the start are gathered (engine/start_progress.py)."""
        start_forkserver(profile.stages)  # its imports run while the model's tokenizer loads here
        progress = progress or StartProgress()
        record = start_record(profile, profile.model.path if source is None else source)
        progress.expect(*record.load())
        steps = StartSteps("engine", 0, progress.record)
        with steps.step("load model"):
            model = load_served_model(profile, source)
        reclaim()  # what a server of ours that died (kill -9) left: its stage processes, its segments
        log.info("starting stages for %s", model.source)
        pipeline = Pipeline.start(profile, model.source, progress=progress.record)
        log.info("all stages ready")
        engine = cls(profile, model, pipeline)
        try:
            engine._warm_and_calibrate(model, steps)
        except BaseException:
            run_apart(engine.close())
            raise
        record.save(progress.times(), progress.elapsed())
        return engine

    def _warm_and_calibrate(self, model: ServedModel, steps: StartSteps) -> None:
        """Before serving: the warm-up burst, then the calibration (or the kept one); either narrows
        the engine to the widest burst that GPU memory allows (`narrow`)."""
        stages, newline = self.profile.stages, newline_id(model.tokenizer)
        widest = full = burst_width(stages)
        if stages.warms_burst():
            # its steps are not timed: admission learns from the calibration's (or the kept ones)
            self._pipeline.broadcast(TimeSteps(False))
            with steps.step("warm burst"):
                widest = warm_burst(self, stages, model.spec, newline)
            self._pipeline.broadcast(TimeSteps(True))
            if widest < full:
                self.narrow(widest)
        if not stages.calibrates():
            return
        kept = KeptCalibration.of(self.profile, model.source)
        if kept.reuse(self):  # the last calibration of these settings, if there is one
            return
        with steps.step("calibration"):
            calibrated = calibrate(self, stages, model.spec, newline, widest)
        if calibrated < widest:
            self.narrow(calibrated)
        if self.narrowed is None:  # a narrowed start's figures stop short of its widths
            kept.save(self.replica_stats())

    def narrow(self, rows: int) -> None:
        """Serve at most `rows` requests at once, spread over each stage's replicas (running and
        waiting alike; more are refused at once): the start's warm-up burst or calibration found GPU
        memory for no wider batch. Kept across stage restarts."""
        stages = [self.profile.stages.stage(s) for s in STAGES]
        with self._lock:
            self.narrowed = rows
            per_replica = (math.ceil(rows / s.replicas) for s in stages)
            self._capacity = tuple(map(min, self._capacity, per_replica))
        log.warning(
            "the start found GPU memory for batches of %d requests, not %d (stages.thinker.max_batch %d, "
            "stages.talker.max_batch %d): serving at most %d at once; a max_batch that fits (smaller KV "
            "caches and fewer graphs) or more GPU memory for the stages serves its whole width",
            rows, burst_width(self.profile.stages), stages[0].max_batch, stages[1].max_batch, rows,
        )  # fmt: skip

    def hold_restarts(self) -> None:
        """The server is shutting down: a stage worker that dies from now on fails its requests, and
        the stages are not restarted (the drain lets the other responses finish)."""
        self._supervisor.hold()

    @property
    def restarting(self) -> bool:
        """True while the supervisor brings the stages back after a worker died."""
        return self._supervisor.restarting

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[EngineOutput, None]:
        queue: asyncio.Queue[EngineOutput] = asyncio.Queue()
        rid = self.submit(request, queue_sink(asyncio.get_running_loop(), queue))
        try:
            while True:
                out = await queue.get()
                yield out
                if isinstance(out, Finished):
                    return
        finally:
            with self._lock:
                left = rid in self._requests
            if left:
                log.info("request %s left early; aborting it in every stage", rid)
                self._abort(rid)

    def submit(self, request: GenerationRequest, sink: Sink) -> str:
        """Start `request` in the stages; its outputs go to `sink` (on the dispatcher thread), the last
        one `Finished`. Returns its id. Raises EngineUnavailable or EngineOverloaded (nothing started),
        ValueError for a request the engine cannot run; `cancel` drops it early."""
        if self._closed:
            raise RuntimeError("engine is closed")
        if self.failure:
            raise EngineUnavailable(self.failure)
        rid = request.request_id
        if request.prefill_only and request.want_audio:
            raise ValueError("a prefill-only request produces no audio")
        grammar = call_grammar(request.tools) if request.tools else None
        if grammar is not None:  # a required call: the thinker is held to one (over response_format)
            request = replace(request, thinker=replace(request.thinker, grammar=grammar))
        with self._lock:
            if self.failure:  # the stages stopped since the check above
                raise EngineUnavailable(self.failure)
            if rid in self._requests:
                raise ValueError(f"duplicate request id {rid}")
            why = self._overload(request)
            if why is not None:
                raise EngineOverloaded(why)
            request = replace(request, route=self._router.assign(request))
            self._requests[rid] = RequestState(request, sink, IncrementalDetokenizer(self._tokenizer))
        self._pipeline.send("thinker", NewRequest(request), replica=request.route[0])
        return rid

    def cancel(self, request_id: str) -> None:
        """Drop a request started by `submit` in every stage (its sink gets `Finished`, "abort")."""
        self._abort(request_id)

    def overloaded(self, request: GenerationRequest) -> str | None:
        """Why `generate` would refuse `request` now (EngineOverloaded), or None. A server checks
        first so that it can answer 503 before it starts streaming."""
        with self._lock:
            return self._overload(request)

    def _overload(self, request: GenerationRequest) -> str | None:
        stage = self._router.full_stage(request, self._capacity)  # the caller holds the lock
        return None if stage is None else self.full_message(stage, self.narrowed)

    async def abort(self, request_id: str) -> None:
        self._abort(request_id)

    def encode_ahead(self, cache_key: str, features: Sequence[np.ndarray]) -> None:
        """Send whole windows of speech still being spoken to the conversation's thinker replica, whose
        audio encoder encodes them when its budget allows (see runners/thinker_audio.py)."""
        if self._closed or self.failure or not features:
            return
        with self._lock:
            replica = self._router.thinker_for(cache_key)
        self._pipeline.send("thinker", EncodeAhead(cache_key, tuple(features)), replica=replica)

    def forget(self, cache_key: str) -> None:
        """Free the conversation's cached prefix (the session ended)."""
        with self._lock:
            replica = self._router.thinker_of(cache_key)
            self._router.forget(cache_key)
        if replica is not None:
            self._pipeline.send("thinker", ForgetPrefix(cache_key), replica=replica)

    def _abort(self, request_id: str) -> None:
        with self._lock:
            state = self._pop(request_id)
        if state is None:
            return
        self._pipeline.broadcast(Abort(request_id))
        if not state.done:
            state.finish("abort")

    def stats(self) -> EngineStats:
        """Per stage, summed over its replicas (last_batch_size: the largest), and the capacity."""
        with self._lock:
            active = len(self._requests)
            conversations = self._router.conversations
            routed = sum(map(sum, self._router.load()))
        per = self.replica_stats()
        stages = tuple(StageStats.total(s, [x for x in per if x.name == s]) for s in STAGES)
        capacity = self.capacity()
        return EngineStats(stages, active, conversations, routed, capacity=capacity, narrowed=self.narrowed)

    def capacity(self) -> Capacity:
        """The audio streams the stages can serve in real time, fitted to their measured step times
        (engine/capacity.py), the streams in flight and the least slack among them."""
        cfg = self.profile.stages.capacity
        now = time.monotonic()
        with self._lock:
            streams = [s for s in self._requests.values() if s.request.want_audio]
            slacks = [x for s in streams if (x := s.slack(now)) is not None]
        worst = min(slacks, default=None)
        if not cfg.enabled:
            return Capacity(None, len(streams), worst)
        caps: dict[str, int] = dict(zip(STAGES, self._capacity, strict=True))
        total, per_stage = engine_capacity(
            self.replica_stats(), self._step_budgets, caps, cfg, self._rows_per_step
        )
        stalled = worst is not None and worst < cfg.min_slack_s
        return Capacity(total, len(streams), worst, stalled, tuple(per_stage.items()))

    def replica_load(self) -> list[list[int]]:
        """Requests assigned to each replica of each stage (thinker, talker, code2wav)."""
        with self._lock:
            return self._router.load()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._grammars.close()
        self._supervisor.hold()
        for rid in list(self._requests):
            self._abort(rid)
        await asyncio.to_thread(self._supervisor.wait)  # a restart stops what it started once closed
        await asyncio.to_thread(self._pipeline.stop)
