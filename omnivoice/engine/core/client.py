"""The engine client: an EngineAPI in the server whose engine core runs in a process of its own
(`stages.core: process`).

What needs only the served model stays here, in the server's process: prompts, log-mel features,
grammar checks, the limits told to clients (engine/model_front.py). Requests, aborts, the encoder's
windows and forgotten conversations go to the core over one channel (engine/core/handle.py); its
outputs come back on a pipe that the event loop reads itself, once the core has started (a reader
thread reads it until then), each batch handed to its requests in one call. The core also pushes
snapshots of its figures (stats, capacity, failure) several times a second, so nothing on the event
loop waits on the core: not `/health`, `/metrics` or admission.

A core that ends (a device fault in a stage thread, a crash, kill -9) or is stuck (silent for
`stages.stuck_after_s`: killed) fails the requests in flight with the engine's error, and a fresh core
starts in the background: the sessions stay connected, new requests are refused as restarting until the
new core is ready, and then served. Restarts are rate-limited and held once the server drains
(engine/restart_budget.py). A stage that dies inside a core is restarted by the core's own supervisor,
as in the in-process engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from omnivoice.config import Profile
from omnivoice.engine.core.handle import CoreHandle
from omnivoice.engine.core.launch import CoreLaunch
from omnivoice.engine.dispatch import RESTARTING, STOPPED
from omnivoice.engine.loading import ServedModel, load_served_model
from omnivoice.engine.model_front import ModelFront
from omnivoice.engine.restart_budget import RestartBudget
from omnivoice.engine.start_progress import StartProgress
from omnivoice.messages import (
    Abort,
    CoreExpect,
    CoreOutputs,
    CoreReady,
    CoreRefused,
    CoreSnapshot,
    CoreStartFailed,
    EncodeAhead,
    ForgetPrefix,
    HoldRestarts,
    NewRequest,
    StartStep,
)
from omnivoice.types import (
    HOPS,
    STAGES,
    Capacity,
    EngineOutput,
    EngineOverloaded,
    EngineStats,
    EngineUnavailable,
    Finished,
    GenerationRequest,
    SecondsHistogram,
    StageStats,
)

log = logging.getLogger(__name__)

REFUSALS: dict[str, type[Exception]] = {
    "overloaded": EngineOverloaded,
    "unavailable": EngineUnavailable,
    "invalid": ValueError,
    "closed": RuntimeError,
}


class CoreChannel(Protocol):
    """What the client sends the core through: a core process of its own (engine/core/handle.py), or
    a link to one shared with other front ends (engine/core/linked.py)."""

    generation: int
    ready: threading.Event  # set once the core is ready, or has failed to start
    error: str | None  # why it did not start

    @property
    def pid(self) -> int | None: ...

    def send(self, msg: Any) -> None: ...

    def attach(self, loop: asyncio.AbstractEventLoop) -> None: ...

    def stop(self, timeout: float = 60.0) -> None: ...


@dataclass
class _Pending:
    """A request the core is running for a caller here (the event loop's only)."""

    audio: bool
    queue: asyncio.Queue[EngineOutput | Exception] = field(default_factory=asyncio.Queue)


class EngineClient(ModelFront):
    def __init__(self, profile: Profile, model: ServedModel, progress: StartProgress) -> None:
        super().__init__(profile, model)
        self._source = model.source
        self._progress = progress
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0  # the loop's thread
        self._pending: dict[str, _Pending] = {}
        self._load = [0, 0]  # requests in flight here, and those of them with audio
        stages = [profile.stages.stage(s) for s in STAGES]
        self._limits = tuple((s.max_batch + s.max_queue) * s.replicas for s in stages)
        self._handle: CoreChannel | None = None
        self._generation = 0
        self._budget = RestartBudget()
        self._failure: str | None = None  # the core ended: restarting, or not coming back
        self._restarting = False
        self._restart: threading.Thread | None = None
        self._snapshot: CoreSnapshot | None = None
        # the hops outputs take back from the core (types.HOPS): timed by the reader and the loop
        self._hops = {hop: SecondsHistogram(hop) for hop in HOPS[1:]}
        self._heard: tuple[str | None, bool] = (None, False)  # the core's failure and restart state
        self._closed = False

    @classmethod
    async def start(
        cls, profile: Profile, progress: StartProgress | None = None, launch: CoreLaunch | None = None
    ) -> EngineClient:
        """Load what the server needs of the model and wait until the core is ready: the core of
        `launch` (started earlier, engine/core/launch.py), else one started here first, so that its
        start (minutes on a GPU) runs while this process loads the model. Raises RuntimeError with
        the core's error if it could not start."""
        progress = progress or StartProgress()
        if launch is None:
            launch = await asyncio.to_thread(CoreLaunch.begin, profile)
        handle = launch.take().handle
        try:
            model = await asyncio.to_thread(load_served_model, profile, launch.source)
        except BaseException:
            await asyncio.to_thread(handle.stop, 10.0)
            raise
        client = cls(profile, model, progress)
        client._loop = asyncio.get_running_loop()
        client._loop_thread = threading.get_ident()
        client._generation, client._handle = 1, handle
        launch.relay.attach(client)
        handle.attach(client._loop)  # from now on the loop reads the core's messages itself
        await asyncio.to_thread(handle.ready.wait)
        if handle.error is not None:
            await asyncio.to_thread(handle.stop, 10.0)
            client._grammars.close()
            raise RuntimeError(f"the engine core could not start: {handle.error}")
        log.info("engine core ready (pid %s)", handle.pid)
        return client

    def _spawn(self) -> CoreHandle:
        self._generation += 1
        handle = CoreHandle(self.profile, self._source, self._generation, self._on_message, self._on_exit)
        self._heard = (None, False)
        self._handle = handle
        handle.start()
        if self._loop is not None:
            handle.attach(self._loop)
        return handle

    # -- what the server reads: the last snapshot, and this client's own view of the core

    @property
    def failure(self) -> str | None:
        return self._failure or self._heard[0]

    @property
    def restarting(self) -> bool:
        return self._restarting or self._heard[1]

    @property
    def narrowed(self) -> int | None:
        snap = self._snapshot
        return snap.stats.narrowed if snap is not None else None

    @property
    def core_pid(self) -> int | None:
        """The running core's process id."""
        handle = self._handle
        return handle.pid if handle is not None else None

    def stats(self) -> EngineStats:
        snap = self._snapshot
        if snap is None:
            return EngineStats((), len(self._pending))
        requests = snap.requests or SecondsHistogram(HOPS[0])
        return replace(snap.stats, hops=(requests, *(h.copy() for h in self._hops.values())))

    def capacity(self) -> Capacity:
        snap = self._snapshot
        capacity = snap.stats.capacity if snap is not None else None
        return capacity if capacity is not None else Capacity(None, self._load[1])

    def replica_stats(self) -> tuple[StageStats, ...]:
        snap = self._snapshot
        return snap.replicas if snap is not None else ()

    def overloaded(self, request: GenerationRequest) -> str | None:
        """Why the core would refuse `request` now, judged from the requests in flight here: a stage
        whose replicas together hold `max_batch + max_queue` each (fewer when the core's start narrowed
        it, `Engine.narrow`, as its snapshots say). The core checks again, replica by
        replica, and its refusal reaches the caller as the same EngineOverloaded."""
        narrowed = self.narrowed
        limits = self._limits if narrowed is None else tuple(min(n, narrowed) for n in self._limits)
        full = [self._load[0] >= limits[0]]
        if request.want_audio:
            full += [self._load[1] >= limits[1], self._load[1] >= limits[2]]
        return next((self.full_message(stage, narrowed) for stage, f in enumerate(full) if f), None)

    # -- the request path

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[EngineOutput, None]:
        if self._closed:
            raise RuntimeError("engine is closed")
        if self.failure:
            raise EngineUnavailable(self.failure)
        if request.prefill_only and request.want_audio:
            raise ValueError("a prefill-only request produces no audio")
        rid = request.request_id
        if rid in self._pending:
            raise ValueError(f"duplicate request id {rid}")
        why = self.overloaded(request)
        if why is not None:
            raise EngineOverloaded(why)
        pending = self._pending[rid] = _Pending(request.want_audio)
        self._count(pending, +1)
        self._send(NewRequest(request, time.monotonic()))
        try:
            while True:
                out = await pending.queue.get()
                if isinstance(out, Exception):
                    raise out
                yield out
                if isinstance(out, Finished):
                    return
        finally:
            if self._pending.get(rid) is pending:
                log.info("request %s left early; aborting it in every stage", rid)
                self._forget(rid)
                self._send(Abort(rid), quiet=True)

    async def abort(self, request_id: str) -> None:
        if request_id in self._pending:
            self._send(Abort(request_id), quiet=True)  # its Finished ("abort") comes back from the core

    def encode_ahead(self, cache_key: str, features: Sequence[np.ndarray]) -> None:
        if self._closed or self.failure or not features:
            return
        self._send(EncodeAhead(cache_key, tuple(features)), quiet=True)

    def forget(self, cache_key: str) -> None:
        if not self._closed:
            self._send(ForgetPrefix(cache_key), quiet=True)

    def hold_restarts(self) -> None:
        self._budget.hold()
        self._send(HoldRestarts(), quiet=True)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._budget.hold()
        restart = self._restart
        if restart is not None:
            await asyncio.to_thread(restart.join)  # it stops the core it started once closed
        handle = self._handle
        if handle is not None:
            await asyncio.to_thread(handle.stop)
        await asyncio.sleep(0)  # deliver what the core sent before it ended
        self._fail_all(None)
        self._grammars.close()

    def _send(self, msg: Any, quiet: bool = False) -> None:
        """Send `msg` to the core; a core that is gone refuses the request (quiet: drops the message)."""
        handle = self._handle
        try:
            if handle is None:
                raise ValueError("no engine core")
            handle.send(msg)
        except (OSError, ValueError) as e:
            if quiet:
                return
            raise EngineUnavailable(self.failure or RESTARTING) from e

    # -- on the event loop: what the core sent

    def _count(self, pending: _Pending, delta: int) -> None:
        self._load[0] += delta
        if pending.audio:
            self._load[1] += delta

    def _forget(self, rid: str) -> _Pending | None:
        pending = self._pending.pop(rid, None)
        if pending is not None:
            self._count(pending, -1)
        return pending

    def _deliver(self, outputs: tuple[EngineOutput, ...], read_at: float) -> None:
        self._hops["loop"].record(time.monotonic() - read_at)
        for out in outputs:
            rid = out.request_id
            pending = self._pending.get(rid)
            if pending is None:
                continue  # late output of a request its caller left
            if isinstance(out, Finished):
                self._forget(rid)
            pending.queue.put_nowait(out)

    def _refuse(self, msg: CoreRefused) -> None:
        pending = self._forget(msg.request_id)
        if pending is not None:
            pending.queue.put_nowait(REFUSALS[msg.kind](msg.message))

    def _fail_all(self, error: str | None) -> None:
        """End every request in flight: failed with `error`, or aborted (None: the engine closed)."""
        for rid in list(self._pending):
            pending = self._forget(rid)
            if pending is not None:
                end = Finished(rid, "error", error=error) if error is not None else Finished(rid, "abort")
                pending.queue.put_nowait(end)

    def _on_loop(self, fn: Any, *args: Any) -> None:
        """Run `fn(*args)` on the event loop: at once when called there (the loop reads the core),
        else handed to it."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        if threading.get_ident() == self._loop_thread:
            fn(*args)
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile (the server is gone)
            loop.call_soon_threadsafe(fn, *args)

    # -- where the core is read: its reader thread until attached, then the event loop

    def _on_message(self, handle: CoreChannel, msg: Any) -> None:
        if handle is not self._handle:
            return  # a replaced core's last words
        if isinstance(msg, CoreOutputs):
            read_at = time.monotonic()
            self._heard = (msg.failure, msg.restarting)
            if msg.sent_at:
                self._hops["outbox"].record(msg.sent_at - msg.made_at)
                self._hops["channel"].record(read_at - msg.sent_at)
            self._on_loop(self._deliver, msg.outputs, read_at)
        elif isinstance(msg, CoreSnapshot):
            self._snapshot = msg
            self._heard = (msg.failure, msg.restarting)
        elif isinstance(msg, CoreRefused):
            self._on_loop(self._refuse, msg)
        elif isinstance(msg, StartStep):
            self._progress.record(msg)
        elif isinstance(msg, CoreExpect):
            self._progress.expect(msg.times, msg.total_s)
        elif isinstance(msg, CoreReady):
            handle.ready.set()
        elif isinstance(msg, CoreStartFailed):
            handle.error = msg.error
        else:
            log.error("engine client: unexpected message %s from the core", type(msg).__name__)

    def _on_exit(self, handle: CoreHandle) -> None:
        code = handle.process.exitcode
        if not handle.ready.is_set():  # ended while starting: whoever started it reads the error
            handle.error = handle.error or f"the engine core ended while starting (exit code {code})"
            handle.ready.set()
            return
        if handle is not self._handle or self._closed:
            return
        refusal = self._budget.refusal()
        self._failure = RESTARTING if refusal is None else STOPPED
        self._restarting = refusal is None
        log.error(
            "the engine core (pid %s) ended (exit code %s); failing %d in-flight requests; %s",
            handle.pid, code, len(self._pending),
            "restarting it" if refusal is None else f"not restarting it: {refusal}",
        )  # fmt: skip
        self._on_loop(self._fail_all, self._failure)
        if refusal is None:
            self._restart = threading.Thread(target=self._restart_core, name="core-restart", daemon=True)
            self._restart.start()

    def _restart_core(self) -> None:
        count = self._budget.spend()
        b = self._budget
        log.warning("restarting the engine core (%d of %d in %.0f s)", count, b.max_restarts, b.window_s)
        t0 = time.perf_counter()
        old = self._handle
        if old is not None:
            old.stop(5.0)
        self._progress = StartProgress()
        handle = self._spawn()
        handle.ready.wait()
        if self._closed:
            handle.stop(timeout=30.0)
            return
        if handle.error is not None:
            log.error("the engine core could not be restarted: %s", handle.error)
            self._failure, self._restarting = f"{STOPPED} and could not be restarted", False
            return
        self._failure, self._restarting = None, False
        log.warning("engine core restarted in %.1f s (pid %s)", time.perf_counter() - t0, handle.pid)
