"""Engine: the asyncio face of the staged pipeline.

    generate(request) -> async iterator of TextDelta | AudioChunk | Finished;  abort(id)

Stage workers run in threads or processes; one dispatcher thread reads what they send back and
hands it to the request's asyncio queue. Leaving the iterator early aborts the request everywhere.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from omnivoice.audio.log_mel import LogMel
from omnivoice.config import Profile
from omnivoice.engine.capacity import engine_capacity
from omnivoice.engine.detokenizer import IncrementalDetokenizer
from omnivoice.engine.device_fault import exit_soon
from omnivoice.engine.leftovers import reclaim
from omnivoice.engine.loading import ServedModel, load_served_model, model_info
from omnivoice.engine.pipeline import Pipeline
from omnivoice.engine.request_state import RequestState
from omnivoice.engine.routing import ReplicaRouter
from omnivoice.engine.stage import StageCrashed
from omnivoice.engine.stuck import ProgressWatch, stage_lines, thread_stacks
from omnivoice.engine.supervisor import Supervisor
from omnivoice.engine.warm_burst import run_apart, warm_burst
from omnivoice.messages import (
    Abort,
    AudioStarted,
    EncodeAhead,
    ForgetPrefix,
    NewRequest,
    PcmOutput,
    StageFinished,
    TokenOutput,
)
from omnivoice.models.dummy import DummySource
from omnivoice.models.grammars import grammar_error
from omnivoice.models.token_prompt import newline_id
from omnivoice.models.tool_calls import call_grammar
from omnivoice.types import (
    STAGES,
    Capacity,
    ChatMessage,
    EngineOutput,
    EngineOverloaded,
    EngineStats,
    Finished,
    FunctionSpec,
    GenerationRequest,
    Grammar,
    Prompt,
    StageStats,
    Tools,
)

log = logging.getLogger(__name__)

WORKER_CHECK_S = 1.0  # how often the dispatcher checks that every stage worker is alive
# What clients are told when a stage worker dies: which process died, and how, is for the log only.
STOPPED = "the engine stopped unexpectedly"
RESTARTING = f"{STOPPED}; it is restarting, retry shortly"


class Engine:
    def __init__(self, profile: Profile, model: ServedModel, pipeline: Pipeline):
        self.profile = profile
        self.spec = model.spec
        self._builder = model.builder
        self._tokenizer = model.tokenizer
        self._pipeline = pipeline
        self._supervisor = Supervisor(profile, model.source)
        self._requests: dict[str, RequestState] = {}
        self._lock = threading.Lock()
        self._progress = ProgressWatch(profile.stages.stuck_after_s)
        self._reset_routing()
        self._closed = False
        # requests one replica of each stage may hold (running + waiting); more are refused at once
        stages = [profile.stages.stage(s) for s in STAGES]
        self._capacity = tuple(s.max_batch + s.max_queue for s in stages)
        # what one step must keep up with, per request: a frame of audio (the thinker's text: one token
        # per frame), or a chunk of frames (Code2Wav)
        frame_s = 1.0 / model.spec.frame_rate
        chunk = profile.stages.code2wav.chunk.frames
        self._step_budgets = {"thinker": frame_s, "talker": frame_s, "code2wav": chunk * frame_s}
        self.failure: str | None = None  # set when a stage worker died; the engine then refuses work
        # what a device fault in a stage of this process does: end the process (device_fault.exit_soon)
        self.on_device_fault: Callable[[str], None] = exit_soon
        self.info = model_info(profile, model.spec, model.builder)
        self._dispatcher = threading.Thread(target=self._dispatch_loop, name="engine-dispatch", daemon=True)
        self._dispatcher.start()

    @classmethod
    async def start(cls, profile: Profile, source: Path | DummySource | None = None) -> Engine:
        return await asyncio.to_thread(cls.start_sync, profile, source)

    @classmethod
    def start_sync(cls, profile: Profile, source: Path | DummySource | None = None) -> Engine:
        """Start the stages of `profile` on `source` (default: the profile's model.path)."""
        model = load_served_model(profile, source)
        reclaim()  # what a server of ours that died (kill -9) left: its stage processes, its segments
        log.info("starting stages for %s", model.source)
        pipeline = Pipeline.start(profile, model.source)
        log.info("all stages ready")
        engine = cls(profile, model, pipeline)
        if profile.stages.warms_burst():
            try:
                warm_burst(engine, profile.stages, model.spec, newline_id(model.tokenizer))
            except BaseException:
                run_apart(engine.close())
                raise
        return engine

    def hold_restarts(self) -> None:
        """The server is shutting down: a stage worker that dies from now on fails its requests, and
        the stages are not restarted (the drain lets the other responses finish)."""
        self._supervisor.hold()

    @property
    def restarting(self) -> bool:
        """True while the supervisor brings the stages back after a worker died."""
        return self._supervisor.restarting

    @property
    def tokenizer(self):
        """The model's tokenizer (a dummy model's is built from code: see models/dummy_tokenizer.py)."""
        return self._tokenizer

    @property
    def log_mel(self) -> LogMel:
        """The model's log-mel features (the prompt builder's)."""
        return self._builder.log_mel

    def build_prompt(self, messages: Sequence[ChatMessage], tools: Sequence[FunctionSpec] = ()) -> Prompt:
        return self._builder.build(messages, self.profile.model.system_prompt, tools)

    def check_grammar(self, grammar: Grammar) -> None:
        error = grammar_error(grammar)
        if error is not None:
            raise ValueError(error)

    def check_tools(self, tools: Tools) -> None:
        grammar = call_grammar(tools)
        if grammar is not None:
            self.check_grammar(grammar)

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[EngineOutput, None]:
        if self._closed:
            raise RuntimeError("engine is closed")
        if self.failure:
            raise RuntimeError(self.failure)
        rid = request.request_id
        if request.prefill_only and request.want_audio:
            raise ValueError("a prefill-only request produces no audio")
        grammar = call_grammar(request.tools) if request.tools else None
        if grammar is not None:  # a required call: the thinker is held to one (over response_format)
            request = replace(request, thinker=replace(request.thinker, grammar=grammar))
        with self._lock:
            if rid in self._requests:
                raise ValueError(f"duplicate request id {rid}")
            why = self._overload(request)
            if why is not None:
                raise EngineOverloaded(why)
            request = replace(request, route=self._router.assign(request))
            state = RequestState(request, asyncio.get_running_loop(), IncrementalDetokenizer(self._tokenizer))
            self._requests[rid] = state
        self._pipeline.send("thinker", NewRequest(request), replica=request.route[0])
        try:
            while True:
                out = await state.queue.get()
                yield out
                if isinstance(out, Finished):
                    return
        finally:
            if not state.done:
                log.info("request %s left early; aborting it in every stage", rid)
                self._abort(rid)

    def overloaded(self, request: GenerationRequest) -> str | None:
        """Why `generate` would refuse `request` now (EngineOverloaded), or None. A server checks
        first so that it can answer 503 before it starts streaming."""
        with self._lock:
            return self._overload(request)

    def _overload(self, request: GenerationRequest) -> str | None:
        stage = self._router.full_stage(request, self._capacity)  # the caller holds the lock
        if stage is None:
            return None
        cfg = self.profile.stages.stage(STAGES[stage])
        return (
            f"the server is at capacity: the {STAGES[stage]} stage holds {cfg.max_batch} running + "
            f"{cfg.max_queue} waiting requests (per replica); retry shortly"
        )

    async def abort(self, request_id: str) -> None:
        self._abort(request_id)

    async def warm(self, prompt: Prompt, cache_key: str) -> None:
        """Prefill `prompt` into `cache_key`'s prefix cache and return once it is there.

        A session calls this while the user is still speaking (with the conversation so far), so the
        turn's request later prefills only the new audio and what follows it.
        """
        req = GenerationRequest(
            f"warm-{uuid.uuid4().hex}", prompt, want_audio=False, cache_key=cache_key, prefill_only=True
        )
        async for _ in self.generate(req):
            pass

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
        return EngineStats(stages, active, conversations=conversations, routed=routed, capacity=capacity)

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
        total, per_stage = engine_capacity(self.replica_stats(), self._step_budgets, caps, cfg)
        stalled = worst is not None and worst < cfg.min_slack_s
        return Capacity(total, len(streams), worst, stalled, tuple(per_stage.items()))

    def replica_stats(self) -> tuple[StageStats, ...]:
        """Every stage worker's own figures."""
        return tuple(self._stage_stats.values())

    def replica_load(self) -> list[list[int]]:
        """Requests assigned to each replica of each stage (thinker, talker, code2wav)."""
        with self._lock:
            return self._router.load()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._supervisor.hold()
        for rid in list(self._requests):
            self._abort(rid)
        await asyncio.to_thread(self._supervisor.wait)  # a restart stops what it started once closed
        await asyncio.to_thread(self._pipeline.stop)

    # ---- dispatcher thread -------------------------------------------------------------------
    def _dispatch_loop(self) -> None:
        next_check = time.monotonic() + WORKER_CHECK_S
        while not self._closed:
            pipeline = self._pipeline  # replaced when the stages restart
            try:
                msg = pipeline.engine_inbox.get(timeout=0.2)
            except (OSError, ValueError, EOFError):  # connector closed at shutdown or restart
                if self._closed:
                    return
                time.sleep(0.05)
                continue
            if pipeline is not self._pipeline:
                continue  # a late message from the stages before the restart
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + WORKER_CHECK_S
                self._check_workers()
            if msg is None:
                continue
            try:
                self._dispatch(msg)
            except Exception:
                log.exception("engine dispatcher failed on %s", type(msg).__name__)

    def _check_workers(self) -> None:
        if self._closed or self.failure:
            return
        now = time.monotonic()
        if not self._requests:
            self._progress.progress(now)
        stuck = self._progress.stuck(now)
        if stuck:
            self._stuck(*stuck[0])
        elif (silent_s := self._progress.stalled(now)) is not None:
            self._stalled(silent_s)
        dead = self._pipeline.dead_workers()
        if not dead:
            return
        refusal = self._supervisor.refusal()
        restart = refusal is None
        # the whole message before any request fails: their callers may read it at once
        self.failure = RESTARTING if restart else STOPPED
        log.error(
            "stage worker stopped: %s; failing %d in-flight requests; %s",
            ", ".join(dead),
            len(self._requests),
            "restarting the stages" if restart else f"not restarting the stages: {refusal}",
        )
        for rid in list(self._requests):
            self._fail(rid, self.failure)
        if restart:
            self._supervisor.restart_in_background(self._pipeline, self._adopt, self._restart_failed)

    def _stuck(self, stage: str, replica: int, silent_s: float) -> None:
        """A stage worker silent for `silent_s` (see engine/stuck.py): a process is killed (the dead
        worker is then restarted); a thread cannot be, so its requests fail and the server exits."""
        reason = f"the {stage} stage made no progress for {silent_s:.0f} s"
        log.error("%s (replica %d); every thread's stack:\n%s", reason, replica, thread_stacks())
        if self._pipeline.kill_worker(stage, replica):
            self._progress.seen(stage, replica, time.monotonic())  # not again while it is found dead
            return
        self._supervisor.hold()
        self.failure = reason
        for rid in list(self._requests):
            self._fail(rid, reason)
        self.on_device_fault(reason)

    def _stalled(self, silent_s: float) -> None:
        """Workers report, yet no request in flight got output for `silent_s` (see engine/stuck.py):
        every stage worker is killed and restarted; if one is a thread, the server exits instead."""
        reason = f"no request made progress for {silent_s:.0f} s"
        log.error(
            "%s (%d in flight); the stages:\n%s\nevery thread's stack (stage processes print theirs to "
            "stderr):\n%s",
            reason,
            len(self._requests),
            stage_lines(self.replica_stats()),
            thread_stacks(),
        )
        self._pipeline.dump_stacks()
        workers = list(self._stage_stats)
        if all(self._pipeline.can_kill(stage, replica) for stage, replica in workers):
            for stage, replica in workers:
                self._pipeline.kill_worker(stage, replica)
            self._progress.progress(time.monotonic())  # the restart fails the requests in flight
            return
        self._supervisor.hold()
        self.failure = reason
        for rid in list(self._requests):
            self._fail(rid, reason)
        self.on_device_fault(reason)

    def _adopt(self, pipeline: Pipeline) -> bool:
        """Serve on the restarted stages; False once the engine is closed (the restart stops them)."""
        if self._closed:
            return False
        with self._lock:
            self._pipeline = pipeline
            self._reset_routing()
        self.failure = None
        return True

    def _restart_failed(self) -> None:
        self.failure = f"{STOPPED} and could not be restarted"

    def _reset_routing(self) -> None:
        p = self._pipeline
        self._stage_stats: dict[tuple[str, int], StageStats] = {
            (s, r): StageStats(s, 0, 0, 0, 0, replica=r) for s in STAGES for r in range(p.replicas(s))
        }
        self._router = ReplicaRouter(*(p.replicas(s) for s in STAGES))
        self._progress.reset(self._stage_stats, time.monotonic())

    def _dispatch(self, msg: object) -> None:
        if isinstance(msg, StageStats):
            self._stage_stats[(msg.name, msg.replica)] = msg
            self._progress.seen(msg.name, msg.replica, time.monotonic())
            return
        if isinstance(msg, StageCrashed):
            self._crashed(msg)
            return
        rid: str | None = getattr(msg, "request_id", None)
        with self._lock:
            state = self._requests.get(rid) if rid is not None else None
        if rid is None or state is None or state.done:
            return  # late output of an aborted or finished request
        self._progress.progress(time.monotonic())
        if isinstance(msg, TokenOutput):
            state.on_tokens(msg)
        elif isinstance(msg, PcmOutput):
            if state.on_pcm(msg, self.spec.output_sample_rate) and self.profile.stages.priority.enabled:
                # its playback starts: the thinker and talker measure its slack from now on
                route = state.request.route
                self._pipeline.send("thinker", AudioStarted(rid), replica=route[0])
                self._pipeline.send("talker", AudioStarted(rid), replica=route[1])
        elif isinstance(msg, StageFinished) and msg.reason == "error":
            self._fail(rid, msg.error or f"{msg.stage} failed")
        elif isinstance(msg, StageFinished) and (reason := state.on_stage_finished(msg)) is not None:
            with self._lock:
                self._pop(rid)
            state.finish(reason)

    def _crashed(self, msg: StageCrashed) -> None:
        in_process = msg.device_fault and self._pipeline.in_this_process(msg.stage)
        if in_process:
            # this process's device context is gone: no restart here can use it (see device_fault)
            self._supervisor.hold()
            self.failure = f"the GPU faulted in the {msg.stage} stage ({msg.error})"
        log.error("%s stage crashed: %s; failing %d requests", msg.stage, msg.error, len(self._requests))
        for crashed in list(self._requests):
            self._fail(crashed, self.failure or STOPPED)
        if in_process:
            self.on_device_fault(self.failure or msg.error)

    def _fail(self, rid: str, error: str) -> None:
        with self._lock:
            state = self._pop(rid)
        if state is None or state.done:
            return
        self._pipeline.broadcast(Abort(rid))
        state.finish("error", error)

    def _pop(self, rid: str) -> RequestState | None:
        """Forget a request (caller holds the lock) and give back its replicas' load."""
        state = self._requests.pop(rid, None)
        if state is not None:
            self._router.release(state.request)
        return state
