"""The fixed topology thinker -> talker -> code2wav, and how its workers are started.

Placement comes from the profile: each stage runs in a thread of this process, in a process of its
own (omnivoice/engine/stage_process.py), or as Ray actors (omnivoice/engine/ray_stages.py). When any
stage is a process every connector is a shared-memory one; when any is on Ray, every connector is a
Ray queue. Stage processes are spawned or forked from a forkserver (`stages.start_method`:
omnivoice/engine/process_start.py); each one's start, until it first reports, is a step of the
start ("start process"). They are listed in a run record (omnivoice/engine/leftovers.py) until they
stop, so that a start after a crash of this server can take back what it left. Stage processes that
share a GPU run as clients of an MPS daemon the pipeline starts, and quits when it stops
(`stages.mps`: omnivoice/engine/mps.py).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omnivoice.config import Profile
from omnivoice.engine.board import PriorityBoard, seats
from omnivoice.engine.connectors import Connector, LocalConnector, ShmConnector
from omnivoice.engine.gc_policy import freeze_built_objects, thaw_built_objects
from omnivoice.engine.leftovers import ProcessId, RunRecord
from omnivoice.engine.mps import MpsDaemon, MpsUnavailable, start_mps
from omnivoice.engine.process_start import stage_context, uses_processes
from omnivoice.engine.process_stats import shm_prefix, unlink_segments
from omnivoice.engine.stage import StageCrashed, StageReady
from omnivoice.engine.stage_process import stage_process_main
from omnivoice.engine.stage_thread import BuildTurns, stage_thread_main
from omnivoice.messages import Shutdown, StartStep
from omnivoice.runners.start_steps import Report
from omnivoice.types import STAGES, StageName

if TYPE_CHECKING:
    from omnivoice.models.dummy import DummySource

log = logging.getLogger(__name__)


class PipelineStartError(RuntimeError):
    pass


@dataclass
class Pipeline:
    inboxes: dict[StageName, list[Connector]]  # one inbox per replica of each stage
    engine_inbox: Connector
    threads: list[threading.Thread] = field(default_factory=list)
    processes: list[Any] = field(default_factory=list)
    ray: Any = None  # RayStages when a stage has `worker: ray` (Ray is imported only then)
    record: RunRecord | None = None  # the stage processes' run record, removed once they stopped
    stopped: bool = False
    # each stage process by its pid and start time, to find one still running after its Process
    # object says it ended (it learns of the exit from the forkserver, if that died first)
    ids: list[ProcessId] = field(default_factory=list)
    # stage processes not heard from yet: when each was started
    launched: dict[tuple[str, int], float] = field(default_factory=dict)
    came_up: list[str] = field(default_factory=list)  # "thinker#0 0.4 s" per stage process heard from
    mps: MpsDaemon | None = None  # the MPS daemon of the stage processes that share a GPU

    @classmethod
    def start(
        cls,
        profile: Profile,
        model_path: Path | DummySource,
        timeout: float = 600.0,
        ray: Any = None,
        progress: Report | None = None,
    ) -> Pipeline:
        """Start every stage worker and wait until all are ready. `ray`: the RayStages of a pipeline
        stopped with keep_ray (a restart), whose Ray connection this one takes over. `progress`: told
        each step of the workers' start (engine/start_progress.py)."""
        cfg = profile.stages.stage
        use_processes = uses_processes(profile.stages)
        ctx = stage_context(profile.stages)
        ray_stages = ray
        if ray_stages is None and any(cfg(s).worker == "ray" for s in STAGES):
            from omnivoice.engine.ray_stages import RayStages

            ray_stages = RayStages(profile)

        def make() -> Connector:
            if ray_stages is not None:
                return ray_stages.connector()
            return ShmConnector(ctx) if use_processes else LocalConnector()

        inboxes = {s: [make() for _ in range(cfg(s).replicas)] for s in STAGES}
        pipe = cls(inboxes=inboxes, engine_inbox=make(), ray=ray_stages)
        downstream: dict[StageName, list[Connector]] = {
            "thinker": inboxes["talker"],
            "talker": inboxes["code2wav"],
            "code2wav": [],
        }
        workers = [(s, r) for s in STAGES for r in range(cfg(s).replicas)]
        # the priority board of the workers on this machine (Ray actors order their own work only)
        n = len(workers)
        board = PriorityBoard.shared(ctx, n) if use_processes else PriorityBoard.local(n)
        seat = seats(board, [(w, cfg(w[0]).replica_device(w[1])) for w in workers])
        if use_processes:  # before any stage process exists, so that all of them are its clients
            try:
                pipe.mps = start_mps(profile.stages)
            except MpsUnavailable as e:
                pipe.stop()
                raise PipelineStartError(str(e)) from e
        environ = {**os.environ, **(pipe.mps.env() if pipe.mps is not None else {})}
        in_thread = tuple(w for w in workers if cfg(w[0]).worker == "thread")
        if in_thread:
            pipe._start_threads(profile, model_path, in_thread, downstream, seat, progress)
        for s, r in workers:
            if (s, r) in in_thread:
                continue
            if cfg(s).worker == "ray":
                pipe.ray.start(s, r, model_path, inboxes[s][r], downstream[s], pipe.engine_inbox)
                continue
            args = (s, r, profile, model_path, inboxes[s][r], downstream[s], pipe.engine_inbox)
            p = ctx.Process(
                target=stage_process_main,
                # the server's pid and environment: a forked process has neither from its parent
                args=(*args, os.getpid(), seat[(s, r)], environ),
                name=f"omnivoice-{s}-{r}",
                daemon=True,
            )
            if progress is not None:
                progress(StartStep(s, r, "start process"))
            pipe.launched[(s, r)] = time.monotonic()
            p.start()
            pipe.processes.append(p)
        if pipe.processes:
            pipe.ids = [i for p in pipe.processes if p.pid and (i := ProcessId.of(p.pid, p.name))]
            pipe.record = RunRecord.write([(p.name, p.pid) for p in pipe.processes])
            atexit.register(pipe._end_at_exit)
        pipe._wait_ready(set(workers), timeout, progress, ctx.get_start_method())
        if in_thread:
            freeze_built_objects("stage threads of this process")
        return pipe

    def _start_threads(
        self,
        profile: Profile,
        model_path: Path | DummySource,
        workers: tuple[tuple[StageName, int], ...],
        downstream: dict[StageName, list[Connector]],
        seat: dict[Any, Any],
        progress: Report | None,
    ) -> None:
        """Start the stages that run on threads of this process; each builds its runner in its thread."""
        from omnivoice.runners.factory import RunnerFactory

        factory = RunnerFactory(profile, model_path, workers, progress)  # the weights, loaded once
        turns = BuildTurns(len(workers))
        for i, (s, r) in enumerate(workers):
            t = threading.Thread(
                target=stage_thread_main,
                args=(factory, turns, i, s, r, self.inboxes[s][r], downstream[s], self.engine_inbox),
                kwargs={"seat": seat[(s, r)], "priority": profile.stages.priority},
                name=f"stage-{s}-{r}",
                daemon=True,
            )
            t.start()
            self.threads.append(t)

    def in_this_process(self, stage: StageName) -> bool:
        """True when `stage` runs on a thread of this process (it shares this process's device context)."""
        return any(t.name.startswith(f"stage-{stage}-") for t in self.threads)

    def _wait_ready(
        self, pending: set[tuple[StageName, int]], timeout: float, progress: Report | None, method: str
    ) -> None:
        deadline = time.monotonic() + timeout
        while pending:
            msg = self.engine_inbox.get(timeout=0.5)
            if isinstance(msg, (StartStep, StageReady)):
                self._heard_from(msg.stage, msg.replica, progress, method)
            if isinstance(msg, StartStep):
                if progress is not None:
                    progress(msg)
            elif isinstance(msg, StageReady):
                pending.discard((msg.stage, msg.replica))
            elif isinstance(msg, StageCrashed):
                self.stop()
                raise PipelineStartError(f"{msg.stage} stage failed to start: {msg.error}")
            if time.monotonic() > deadline:
                self.stop()
                raise PipelineStartError(f"stages not ready after {timeout:.0f} s: {sorted(pending)}")
            for p in self.processes:
                if not p.is_alive() and p.exitcode is not None:
                    self.stop()
                    raise PipelineStartError(f"{p.name} exited with code {p.exitcode} while starting")
            if self.ray is not None and (dead := self.ray.dead()):
                self.stop()
                raise PipelineStartError(f"stage actors ended while starting: {', '.join(dead)}")

    def _heard_from(self, stage: str, replica: int, progress: Report | None, method: str) -> None:
        """A stage worker's first message: a stage process has come up (its imports done)."""
        began = self.launched.pop((stage, replica), None)
        if began is None:
            return  # a thread or an actor, or a process heard from before
        took = time.monotonic() - began
        if progress is not None:
            progress(StartStep(stage, replica, "start process", took))
        self.came_up.append(f"{stage}#{replica} {took:.1f} s")
        if not self.launched:
            log.info("stage processes (%s) up: %s", method, ", ".join(self.came_up))

    def _kill_strays(self) -> None:
        """Kill the stage processes that run although their Process objects say they ended: those
        forked from a forkserver that was killed (it could not tell this process of their exits)."""
        for i in self.ids:
            if i.running():
                log.warning("%s (pid %d) still runs after its end was reported; killing it", i.name, i.pid)
                with contextlib.suppress(OSError):
                    os.kill(i.pid, signal.SIGKILL)

    def _end_at_exit(self) -> None:
        """This process exits with the stage processes still running (the shutdown that stops the
        engine did not run, or failed). multiprocessing's own exit handler, which runs after this
        one, would signal them with SIGTERM, which they ignore, then wait for them forever: kill them
        here, and unlink the segments of the messages no one will read."""
        for p in self.processes:
            if p.is_alive():
                p.kill()
        for p in self.processes:
            p.join(5.0)
        self._kill_strays()
        if self.record is not None:
            self.record.remove()
        if self.mps is not None:
            self.mps.stop()
        unlink_segments(shm_prefix())

    def dead_workers(self) -> list[str]:
        """Names of stage threads, processes or actors that have stopped (only meaningful before stop())."""
        dead = [t.name for t in self.threads if not t.is_alive()]
        dead += [f"{p.name} (exit code {p.exitcode})" for p in self.processes if not p.is_alive()]
        return dead + (self.ray.dead() if self.ray is not None else [])

    def can_kill(self, stage: str, replica: int) -> bool:
        """Whether the worker of a stage replica can be killed: a process or an actor, not a thread."""
        return not any(t.name == f"stage-{stage}-{replica}" for t in self.threads)

    def dump_stacks(self, settle_s: float = 0.5) -> None:
        """Ask every live stage process for its threads' stacks (SIGUSR1: they print them to stderr),
        and give them `settle_s` to do so, since the caller may kill them next."""
        live = [pid for p in self.processes if p.is_alive() and (pid := p.pid) is not None]
        for pid in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)
        if live:
            time.sleep(settle_s)

    def kill_worker(self, stage: str, replica: int) -> bool:
        """Kill the process or actor of a stage replica (its death is then found like any other);
        False when that worker is a thread of this process, which cannot be stopped from outside."""
        for p in self.processes:
            if p.name == f"omnivoice-{stage}-{replica}":
                if p.is_alive():
                    p.kill()
                return True
        return self.ray is not None and self.ray.kill(stage, replica)

    def replicas(self, stage: StageName) -> int:
        return len(self.inboxes[stage])

    def send(self, stage: StageName, msg: Any, replica: int = 0) -> None:
        """Send `msg` to a stage replica; once this pipeline is stopped (the stages restart, the engine
        closes) it goes nowhere: a session that ends meanwhile has nothing left to tell these stages."""
        if not self.stopped:
            self._put(self.inboxes[stage][replica], msg)

    def broadcast(self, msg: Any) -> None:
        """`send` to every stage replica."""
        if not self.stopped:
            self._put_all(msg)

    def _put_all(self, msg: Any) -> None:
        for s in STAGES:
            for inbox in self.inboxes[s]:
                self._put(inbox, msg)

    def _put(self, inbox: Connector, msg: Any) -> None:
        try:
            inbox.put(msg)
        except (ValueError, OSError):  # closed by a stop that began after the check
            if not self.stopped:
                raise

    def stop(self, timeout: float = 10.0, keep_ray: bool = False) -> None:
        """Shut every worker down and close the connectors; a second call does nothing.

        The Ray connection (and the local cluster, if this pipeline started one) is closed too, unless
        `keep_ray`: a restart hands it to the next pipeline, since Ray cannot be reliably shut down and
        started again in a process whose threads have used it."""
        if self.stopped:
            return
        self.stopped = True
        atexit.unregister(self._end_at_exit)
        self._put_all(Shutdown())
        for t in self.threads:
            t.join(timeout)
        for p in self.processes:
            p.join(timeout)
            if p.is_alive():
                log.warning("%s did not stop in %.0f s; killing it", p.name, timeout)
                p.kill()
                p.join()
        self._kill_strays()
        if self.record is not None:
            self.record.remove()
        if self.mps is not None:  # its clients have all exited: a next start's daemon is a fresh one
            self.mps.stop()
        if self.ray is not None:
            self.ray.stop(timeout)
        for c in [*(c for s in STAGES for c in self.inboxes[s]), self.engine_inbox]:
            c.close()
        if self.threads:
            thaw_built_objects()  # the stages' objects may be collected again once they are garbage
        if self.ray is not None and not keep_ray:
            self.ray.shutdown()
