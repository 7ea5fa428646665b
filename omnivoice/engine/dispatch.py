"""The engine's dispatcher thread: what the stage workers send back, and whether they are well.

One thread reads the pipeline's engine inbox: stage figures, tokens, PCM and ends go to each request's
state (and from there to its asyncio queue); a crash, a dead worker, a stuck worker or a stall (see
engine/stuck.py) fails the requests in flight and restarts the stages through the supervisor, or ends
the process where its device cannot be trusted again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from omnivoice.config import Profile
from omnivoice.engine.api import RESTARTING, STOPPED
from omnivoice.engine.capacity import carry_step_times
from omnivoice.engine.pipeline import Pipeline
from omnivoice.engine.request_state import RequestState
from omnivoice.engine.routing import ReplicaRouter
from omnivoice.engine.stage import StageCrashed
from omnivoice.engine.stuck import ProgressWatch, stage_lines, thread_stacks
from omnivoice.engine.supervisor import Supervisor
from omnivoice.messages import Abort, AudioStarted, PcmOutput, StageFinished, TokenOutput
from omnivoice.models.loader import ModelSpec
from omnivoice.types import STAGES, StageStats

log = logging.getLogger(__name__)

WORKER_CHECK_S = 1.0  # how often the dispatcher checks that every stage worker is alive


class Dispatch:
    """The dispatcher half of the Engine (which sets these attributes up and starts the thread)."""

    profile: Profile
    spec: ModelSpec
    failure: str | None
    on_device_fault: Callable[[str], None]
    _pipeline: Pipeline
    _supervisor: Supervisor
    _requests: dict[str, RequestState]
    _lock: threading.Lock
    _progress: ProgressWatch
    _router: ReplicaRouter
    _stage_stats: dict[tuple[str, int], StageStats]
    _carried: dict[tuple[str, int], tuple[tuple[int, float, int], ...]]  # step times of replaced workers
    _closed: bool

    def replica_stats(self) -> tuple[StageStats, ...]:
        """Every stage worker's own figures."""
        return tuple(self._stage_stats.values())

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
        # the whole message before any request fails: their callers may read it at once; under the
        # lock, so a request that `generate` admits meanwhile is either failed here or refused there
        with self._lock:
            self.failure = failure = RESTARTING if restart else STOPPED
            failing = list(self._requests)
        log.error(
            "stage worker stopped: %s; failing %d in-flight requests; %s",
            ", ".join(dead),
            len(failing),
            "restarting the stages" if restart else f"not restarting the stages: {refusal}",
        )
        for rid in failing:
            self._fail(rid, failure)
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
        self._end_process(reason)

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
        self._end_process(reason)

    def _end_process(self, reason: str) -> None:
        """A stage thread of this process is stuck and cannot be stopped: fail every request with
        `reason`, restart nothing, and end the process for its supervisor."""
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

    def seed_step_times(self, workers: dict[tuple[str, int], tuple[tuple[int, float, int], ...]]) -> None:
        """Step times measured before these workers timed any (a kept calibration:
        engine/kept_calibration.py) stand in for each batch size until the worker has timed that size
        itself, as a replaced worker's do after a restart."""
        with self._lock:
            self._carried = {**self._carried, **workers}
            for key, times in workers.items():
                if (st := self._stage_stats.get(key)) is not None:
                    self._stage_stats[key] = replace(st, step_times=carry_step_times(times, st.step_times))

    def _reset_routing(self) -> None:
        p = self._pipeline
        # A restarted worker has timed no step yet; the step times its predecessor measured (the
        # start's calibration, then served steps) stand in for each batch size until it has timed
        # that size itself, so admission does not fall back to what a fresh server knows.
        self._carried = {key: st.step_times for key, st in self._stage_stats.items() if st.step_times}
        self._stage_stats = {
            (s, r): StageStats(s, 0, 0, 0, 0, replica=r, step_times=self._carried.get((s, r), ()))
            for s in STAGES
            for r in range(p.replicas(s))
        }
        self._router = ReplicaRouter(*(p.replicas(s) for s in STAGES))
        self._progress.reset(self._stage_stats, time.monotonic())

    def _dispatch(self, msg: object) -> None:
        if isinstance(msg, StageStats):
            with self._lock:  # a seed (seed_step_times) lands before or after this report, not within
                carried = self._carried.get((msg.name, msg.replica))
                if carried:
                    msg = replace(msg, step_times=carry_step_times(carried, msg.step_times))
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
            self._fail(rid, msg.error or f"{msg.stage} failed", out_of_memory=msg.out_of_memory)
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

    def _fail(self, rid: str, error: str, out_of_memory: bool = False) -> None:
        with self._lock:
            state = self._pop(rid)
        if state is None or state.done:
            return
        self._pipeline.broadcast(Abort(rid))
        state.finish("error", error, out_of_memory)

    def _pop(self, rid: str) -> RequestState | None:
        """Forget a request (caller holds the lock) and give back its replicas' load."""
        state = self._requests.pop(rid, None)
        if state is not None:
            self._router.release(state.request)
        return state
