"""StageWorker: the loop every stage runs, in a thread or in its own process.

    loop { take new inputs; publish urgency; give way, or runner.step(defer_ahead); route outputs }

The runner decides what runs in a step (its own continuous batching, in playback order:
runners/priority.py); the worker owns messaging and failure handling: a runner error fails the
requests it was working on, never the worker. Through its seat on the priority board (engine/board.py)
the worker tells the workers on its device how urgent its work is, and learns how urgent theirs is:
while any holds FIRST or DRY work, its own AHEAD requests wait (`defer_ahead`), and if all its work
is AHEAD it gives way for a moment, at most `max_yield_ms` in a row. It also times its steps by batch
size, what the engine's measured capacity is fitted to (engine/capacity.py). While the runner has no
work, the worker captures the CUDA graphs it left for after the start, one per idle turn of the loop
(runners/graph_backlog.py).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Protocol

from omnivoice.config import PriorityConfig
from omnivoice.engine.board import PriorityBoard, Seat
from omnivoice.engine.capacity import StepTimes
from omnivoice.engine.connectors import Connector
from omnivoice.engine.device_fault import DeviceFault, failure_text
from omnivoice.engine.mps import mps_client
from omnivoice.engine.parent_watch import server_alive
from omnivoice.engine.process_stats import process_stats
from omnivoice.engine.step_clock import GpuUtilization, StepTime, ThreadClock
from omnivoice.messages import (
    Abort,
    CodecChunk,
    NewRequest,
    PcmOutput,
    Shutdown,
    StageFinished,
    ThinkerChunk,
    TimeSteps,
    TokenOutput,
)
from omnivoice.runners.device_errors import is_device_fault, is_out_of_memory
from omnivoice.runners.graph_backlog import GraphBacklog
from omnivoice.runners.priority import Priority
from omnivoice.types import STAGES, StageName, StageStats

log = logging.getLogger(__name__)

STATS_INTERVAL_S = 0.1
IDLE_STATS_INTERVAL_S = 1.0  # an idle worker still reports (its process figures) this often
PARENT_CHECK_S = 0.5  # how often a stage process checks that its server still runs
STAGE_INDEX = {name: i for i, name in enumerate(STAGES)}
ABORTED_MEMORY = 4096
# How long an aborted id is remembered. Messages for it still in flight were sent by the upstream
# stage before it handled the same abort (one of its steps plus one queue hop: far less than this);
# forgetting it afterwards lets the worker's tables drain back to empty when it goes idle.
TOMBSTONE_TTL_S = 30.0
# A step (or a batch of incoming messages) at least this long, and SLOW_FACTOR times the stage's usual
# step, is logged with what the stage held: the one-off stalls that a mean per step hides.
SLOW_S = 0.25
SLOW_FACTOR = 8.0


class StageRunner(Protocol):
    name: StageName

    def accept(self, msg: Any) -> list[Any]:
        """Take a NewRequest / ThinkerChunk / CodecChunk; may return outputs at once."""
        ...

    def abort(self, request_id: str) -> None: ...

    def has_work(self) -> bool:
        """True when a step can make progress now (not merely when requests are held)."""
        ...

    def urgency(self) -> Priority | None:
        """The most urgent class of the work a step can do now; None if there is none."""
        ...

    def step(self, defer_ahead: bool = False) -> list[Any]:
        """One step of the work it holds; without its AHEAD requests when `defer_ahead`."""
        ...

    def active_ids(self) -> list[str]: ...

    def stats(self) -> StageStats: ...

    # Optionally `graph_backlog` (runners/graph_backlog.py): CUDA graphs left for after the start,
    # which the worker captures one at a time while the runner has no work.


@dataclass(frozen=True)
class StageReady:
    stage: StageName
    replica: int = 0


@dataclass(frozen=True)
class StageCrashed:
    stage: StageName
    error: str
    device_fault: bool = False  # the stage's device context is unusable (engine.device_fault)


class StageWorker:
    def __init__(
        self,
        runner: StageRunner,
        inbox: Connector,
        downstream: list[Connector],
        engine: Connector,
        parent_pid: int | None = None,
        replica: int = 0,
        seat: Seat | None = None,
        priority: PriorityConfig | None = None,
    ) -> None:
        """`seat`: its place on the board shared with the workers on its device (default: a board of
        its own, as a Ray actor has)."""
        self.runner = runner
        self.replica = replica
        self.seat = seat or Seat(PriorityBoard.local(1), 0, ())
        self.priority = priority or PriorityConfig()
        self._gave_way_s = 0.0  # in all
        self._giving_way_s = 0.0  # in a row, since its last step
        self._step_times = StepTimes()
        self._timing = True  # TimeSteps: off while the warm-up burst runs
        # the next stage's replica of each request in flight here (sticky: from its route)
        self._next: dict[str, int] = {}
        self.parent_pid = parent_pid  # a stage process exits when the server that started it is gone
        self.inbox = inbox
        self.downstream = downstream
        self.engine = engine
        self._last_stats = 0.0
        self._sent_stats: StageStats | None = None
        self._busy_s = 0.0
        self._step_time = StepTime()
        self._clock: ThreadClock | None = None  # made in the thread that serves (it measures that one)
        self._gpu = GpuUtilization(getattr(runner, "device", None))
        self._mps_client = mps_client(getattr(runner, "device", None))
        self._ingest_s = 0.0
        self._ingested = 0
        self._usual_step_s: float | None = None  # moving average of the step time
        # Requests aborted here recently (id -> when): messages already in flight for them (from the
        # upstream stage, sent before it saw the abort) must not start them again.
        self._aborted: OrderedDict[str, float] = OrderedDict()
        # CUDA graphs the runner left for after the start (runners/graph_backlog.py); none by default
        self._backlog: GraphBacklog = getattr(runner, "graph_backlog", None) or GraphBacklog(runner.name)

    def run(self) -> None:
        """Serve until Shutdown, the server going away, or a device fault (reported as StageCrashed)."""
        try:
            self._serve()
        except DeviceFault as e:
            log.critical("%s stage (replica %d) stopped: %s", self.runner.name, self.replica, e)
            self.engine.put(StageCrashed(self.runner.name, str(e), device_fault=True))
        finally:
            self.seat.publish(None)  # a worker that is gone holds no one up
            if self._clock is not None:
                self._clock.close()

    def _serve(self) -> None:
        name = self.runner.name
        _own_cuda_stream(self.runner)
        self._clock = ThreadClock()
        self.engine.put(StageReady(name, self.replica))
        log.info("%s stage ready (replica %d)", name, self.replica)
        next_parent_check = 0.0
        while True:
            if self.runner.has_work():
                msgs = self.inbox.drain()
            else:
                self.seat.publish(None)
                # graphs left for after the start are captured while nothing else is to be done
                first = self.inbox.get(timeout=0.0 if self._backlog else 0.5)
                msgs = [] if first is None else [first, *self.inbox.drain()]
                if not msgs and self._backlog:
                    self._capture_one()
            if self.parent_pid is not None and time.monotonic() >= next_parent_check:
                # busy or idle: a stage process must not go on computing for a server that is gone
                next_parent_check = time.monotonic() + PARENT_CHECK_S
                if not server_alive(self.parent_pid):
                    log.warning("%s stage: parent process %d is gone; exiting", name, self.parent_pid)
                    return
            began = time.perf_counter()
            for msg in msgs:
                if isinstance(msg, Shutdown):
                    log.info("%s stage stopping", name)
                    return
                if isinstance(msg, TimeSteps):
                    self._timing = msg.enabled
                    continue
                self._handle(msg)
            if msgs:
                took = time.perf_counter() - began
                self._ingest_s += took
                self._ingested += len(msgs)
                self._report_slow(f"taking {len(msgs)} messages", took)
            if self.runner.has_work():
                defer = self._plan()
                if defer is None:
                    self._give_way()
                else:
                    self._step(defer)
            self._publish_stats()

    def _plan(self) -> bool | None:
        """Publish how urgent this stage's work is; whether its next step defers its AHEAD requests,
        or None: give way instead (all its work is AHEAD and a worker on its device has urgent work)."""
        own = self.runner.urgency()
        self.seat.publish(own)
        if own is None:
            return False
        peer = self.seat.peer_urgent()
        if own == Priority.AHEAD:
            waited_out = self._giving_way_s * 1e3 >= self.priority.max_yield_ms
            return None if peer and not waited_out else False
        return peer or own.urgent

    def _give_way(self) -> None:
        wait = self.priority.yield_ms / 1e3
        time.sleep(wait)
        self._giving_way_s += wait
        self._gave_way_s += wait

    def _handle(self, msg: Any) -> None:
        if isinstance(msg, Abort):
            self._tombstone(msg.request_id)
            self._next.pop(msg.request_id, None)
            self.runner.abort(msg.request_id)
            return
        rid = _request_id(msg)
        if rid in self._aborted:
            return
        request = msg.request if isinstance(msg, NewRequest | ThinkerChunk) else None
        if request is not None and self.downstream:
            self._next[rid] = request.route[STAGE_INDEX[self.runner.name] + 1]
        try:
            self._route(self.runner.accept(msg))
        except Exception as e:
            log.exception("%s stage rejected request %s", self.runner.name, rid)
            self._fail([rid], e)
            if is_device_fault(e):
                raise DeviceFault(f"{self.runner.name}: {e}") from e

    def _step(self, defer_ahead: bool) -> None:
        self._giving_way_s = 0.0
        clock = self._clock
        cpu0, runnable0 = clock.read() if clock is not None else (0.0, 0.0)
        started = time.perf_counter()
        graphs = self._backlog.captured()
        try:
            outs = self.runner.step(defer_ahead)
        except Exception as e:
            ids = self.runner.active_ids()
            if is_out_of_memory(e):  # not a bug: the allocator's words say what did not fit
                log.warning(
                    "%s stage: a step ran out of GPU memory; failing requests %s: %s",
                    self.runner.name, ids, e, exc_info=log.isEnabledFor(logging.DEBUG),
                )  # fmt: skip
            else:
                log.exception("%s stage step failed; failing requests %s", self.runner.name, ids)
            self._fail(ids, e)
            if is_device_fault(e):
                raise DeviceFault(f"{self.runner.name}: {e}") from e
            return
        finally:
            took = time.perf_counter() - started
            self._busy_s += took
            cpu1, runnable1 = clock.read() if clock is not None else (0.0, 0.0)
            self._step_time.cpu_s += cpu1 - cpu0
            self._step_time.runnable_s += runnable1 - runnable0
        self._route(outs)
        if self._backlog.captured() != graphs:
            return  # it captured a graph left for later first: not a step time to learn from
        split = (cpu1 - cpu0, runnable1 - runnable0) if clock is not None else None
        self._report_slow("a step", took, split)
        stats = self.runner.stats()
        if (
            self._timing and not stats.last_step_prefilled
        ):  # a prefill (a burst's, a wave's) is no decode step
            self._step_times.add(stats.last_batch_size, took)
        usual = self._usual_step_s
        self._usual_step_s = took if usual is None else 0.9 * usual + 0.1 * took

    def _capture_one(self) -> None:
        """Capture one graph left for after the start; a failure there is a failed step's."""
        try:
            self._backlog.capture_next()
        except Exception as e:
            if is_device_fault(e):
                raise DeviceFault(f"{self.runner.name}: {e}") from e
            name = self.runner.name
            log.exception("%s stage: capturing a graph left for later failed; that shape runs eagerly", name)

    def _report_slow(self, what: str, took: float, split: tuple[float, float] | None = None) -> None:
        """Log `what` if it took far longer than a step usually does; `split` (a step's time on a CPU
        and runnable waiting for one) says where the time went: the rest the thread was blocked (the
        GIL, a lock, a device wait that sleeps), and a CUDA sync that spins is time on a CPU."""
        usual = self._usual_step_s
        if usual is None or took < SLOW_S or took < SLOW_FACTOR * usual:
            return
        st = self.runner.stats()
        where = ""
        if split is not None:
            cpu, runnable = split
            blocked = max(0.0, took - cpu - runnable)
            where = (
                f"; on a CPU {cpu * 1e3:.0f} ms, waiting for one {runnable * 1e3:.0f} ms, "
                f"blocked {blocked * 1e3:.0f} ms{', with a prefill' if st.last_step_prefilled else ''}"
            )
        log.info(
            "%s stage: slow: %s took %.0f ms (a step usually %.0f ms); %d running, %d queued, "
            "last batch %d%s",
            self.runner.name,
            what,
            took * 1e3,
            usual * 1e3,
            st.running,
            st.queued,
            st.last_batch_size,
            where,
        )

    def _tombstone(self, rid: str) -> None:
        self._aborted[rid] = time.monotonic()
        self._aborted.move_to_end(rid)
        while len(self._aborted) > ABORTED_MEMORY:
            self._aborted.popitem(last=False)

    def _expire_tombstones(self) -> None:
        oldest = time.monotonic() - TOMBSTONE_TTL_S
        while self._aborted and next(iter(self._aborted.values())) < oldest:
            self._aborted.popitem(last=False)

    def _fail(self, ids: list[str], err: Exception) -> None:
        memory = is_out_of_memory(err)
        error = f"{self.runner.name}: {failure_text(err)}"
        for rid in ids:
            self._tombstone(rid)
            self._next.pop(rid, None)
            self.runner.abort(rid)
            self.engine.put(StageFinished(rid, self.runner.name, "error", error=error, out_of_memory=memory))

    def _route(self, outs: list[Any]) -> None:
        """Each destination's share of `outs`, in their order, in one `put_many`: a step's outputs
        cost a transfer per destination, not one per request. Chunks go downstream before the
        engine hears of any request's end."""
        downstream: dict[int, list[Any]] = {}
        engine: list[Any] = []
        for out in outs:
            if isinstance(out, ThinkerChunk | CodecChunk):
                if self.downstream:
                    downstream.setdefault(self._next.get(out.request_id, 0), []).append(out)
            elif isinstance(out, TokenOutput | PcmOutput | StageFinished):
                if isinstance(out, StageFinished):
                    self._next.pop(out.request_id, None)  # its last chunk downstream is routed already
                engine.append(out)
            else:
                raise TypeError(f"{self.runner.name} produced an unroutable {type(out).__name__}")
        for replica, msgs in downstream.items():
            self.downstream[replica].put_many(msgs)
        self.engine.put_many(engine)

    def _publish_stats(self) -> None:
        # Periodically while busy (and, slower, while idle); at once when something changed and the
        # stage went idle, so readers never see finished requests as still running.
        now = time.monotonic()
        self._expire_tombstones()
        stats = replace(
            self.runner.stats(),
            routes=len(self._next),
            tombstones=len(self._aborted),
            graphs_pending=len(self._backlog),
        )
        busy = self.runner.has_work()
        idle_change = not busy and stats != self._sent_stats
        interval = STATS_INTERVAL_S if busy else IDLE_STATS_INTERVAL_S
        if idle_change or now - self._last_stats >= interval:
            self._last_stats = now
            self._sent_stats = stats
            proc = process_stats()
            self.engine.put(
                replace(
                    stats,
                    busy_s=self._busy_s,
                    replica=self.replica,
                    pid=proc.pid,
                    rss_bytes=proc.rss_bytes,
                    open_fds=proc.open_fds,
                    step_times=self._step_times.snapshot(),
                    gave_way_s=self._gave_way_s,
                    step_cpu_s=self._step_time.cpu_s,
                    step_runnable_s=self._step_time.runnable_s,
                    ingest_s=self._ingest_s,
                    ingested=self._ingested,
                    gpu_utilization=self._gpu.read(),
                    gpu_busy_s=self._gpu.busy_s,
                    mps_client=self._mps_client,
                )
            )


def _request_id(msg: Any) -> str:
    if isinstance(msg, NewRequest):
        return msg.request.request_id
    return str(getattr(msg, "request_id", "?"))


def _own_cuda_stream(runner: Any) -> None:
    """On a GPU each stage issues its work on a stream of its own (the current stream is per thread):
    a stage waiting for its results (one sync per step) then waits for its own kernels only, and the
    stages' kernels can run side by side. Stages hand each other host data, never device tensors."""
    device = getattr(runner, "device", None)
    if device is None or str(device).split(":")[0] != "cuda":
        return
    import torch

    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))  # what building the runner queued comes first
    torch.cuda.set_stream(stream)
