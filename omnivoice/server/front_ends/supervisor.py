"""`omnivoice serve` with `server.front_ends` > 1: a supervisor process that owns the port, the engine
core and the front-end processes, and serves nothing itself.

- It binds the port once; every front end serves the same listening socket, and the kernel hands
  each new connection to one of them (a session stays on the front end that accepted it).
- It starts the engine core (engine/core/handle.py) as a lone server would, watches it (a core silent
  for `stages.stuck_after_s` is killed) and restarts it when it ends, within the restart budget
  (engine/restart_budget.py). Each time a core is ready it links every front end to it: a socket pair
  whose ends go to the core (through the core's door) and to the front end (`CoreAttach`), passed as
  descriptors on packet sockets (engine/core/packets.py). When it ends, every front end hears
  `CoreLost`: their requests in flight fail, their sessions stay connected.
- It starts the front ends (front_end.py) beside the core, so they answer /health while it starts,
  and tells them the core's start steps. A front end that ends unexpectedly is started again (its own
  sessions are gone; the others' go on) and linked to the running core.
- It carries the front ends' questions to one another (member.py) and logs "omnivoice serving ..."
  once every front end serves.
- SIGTERM or SIGINT drains: each front end is told to stop (`Stop`: it drains as a lone server does
  on a signal; front ends ignore the signals themselves, which a terminal sends the whole process
  group), and once they have ended the core is stopped. A second signal is passed on too (cancel
  what is in flight), and a third (exit now).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing as mp
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omnivoice.config import Profile
from omnivoice.engine.api import RESTARTING, STOPPED
from omnivoice.engine.core.handle import CoreHandle
from omnivoice.engine.core.packets import PacketLink
from omnivoice.engine.model_source import resolve_model_path
from omnivoice.engine.restart_budget import RestartBudget
from omnivoice.engine.start_progress import StartProgress
from omnivoice.messages import CoreExpect, CoreReady, CoreSnapshot, CoreStartFailed, StartStep
from omnivoice.server.auth.keys import ApiKeys
from omnivoice.server.fleet.messages import (
    Answer,
    Answers,
    Ask,
    CoreAttach,
    CoreFailed,
    CoreLost,
    FrontEndUp,
    Stop,
)
from omnivoice.server.front_ends.process import FrontEndSpec, front_end_main, shared_names
from omnivoice.server.tally import SharedTally

if TYPE_CHECKING:
    from omnivoice.models.dummy_source import DummySource

log = logging.getLogger(__name__)

ANSWER_TIMEOUT_S = 4.0  # a question's answers are sent once all came, or after this
STOP_GRACE_S = 30.0  # past the drain timeout, how long a front end has to end before it is killed


@dataclass
class _FrontEnd:
    index: int
    process: Any  # multiprocessing.Process
    link: PacketLink
    up: bool = False  # said FrontEndUp
    gone: bool = False


@dataclass
class _Question:
    origin: int
    waiting: set[int]
    answers: list[Any] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


def bind(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """The listening socket every front end serves (OSError if the port is taken)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=backlog, reuse_port=False)
    sock.set_inheritable(True)
    return sock


class Supervisor:
    def __init__(self, profile: Profile, host: str, port: int, log_level: str, keys: ApiKeys) -> None:
        self.profile = profile
        self.count = profile.server.front_ends
        self._host, self._port, self._level, self._keys = host, port, log_level, keys
        self._ctx = mp.get_context("spawn")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sock: socket.socket | None = None
        self._source: Path | DummySource | None = None
        self._tally: SharedTally | None = None
        self._fronts: dict[int, _FrontEnd] = {}
        self._core: CoreHandle | None = None
        self._progress = StartProgress()  # the running core's start, logged here
        self._door: PacketLink | None = None  # the supervisor's end of the running core's door
        self._core_ready = False
        self._generation = 0
        self._budget = RestartBudget()
        self._front_budget = RestartBudget()
        self._questions: dict[tuple[int, int], _Question] = {}
        self._stopping = False
        self._signals = 0
        self._announced = False
        self._done: asyncio.Event | None = None
        self._code = 0

    async def run(self) -> int:
        """Serve until a signal (0), or until the core cannot start (1)."""
        self._loop = asyncio.get_running_loop()
        self._done = asyncio.Event()
        try:
            self._sock = bind(self._host, self._port)
        except OSError as e:
            log.error("cannot serve on %s:%d: %s", self._host, self._port, e.strerror or e)
            return 1
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            self._source = await asyncio.to_thread(resolve_model_path, self.profile)
        except (OSError, ValueError) as e:
            log.error("engine failed to start (%s: %s); shutting down", type(e).__name__, e)
            return 1
        self._tally = SharedTally(shared_names(self.profile, self._keys), self._ctx)
        log.info("starting the engine core and %d front ends", self.count)
        self._start_core()
        for i in range(self.count):
            self._start_front(i)
        await self._done.wait()
        await self._stop_all()
        return self._code

    # -- the core

    def _start_core(self) -> None:
        assert self._source is not None
        self._generation += 1
        door, core_door = PacketLink.pair()
        handle = CoreHandle(
            self.profile, self._source, self._generation, self._from_core, self._core_ended, door=core_door
        )
        self._core, self._door, self._core_ready = handle, PacketLink(door), False
        self._progress = StartProgress()
        handle.start()
        core_door.close()  # the core has its own copy
        assert self._loop is not None
        handle.attach(self._loop)

    def _from_core(self, handle: CoreHandle, msg: Any) -> None:
        self._call_on_loop(self._core_message, handle, msg)

    def _core_message(self, handle: CoreHandle, msg: Any) -> None:
        if handle is not self._core:
            return
        if isinstance(msg, StartStep):
            self._progress.record(msg)
            self._tell_all(msg)
        elif isinstance(msg, CoreExpect):
            self._progress.expect(msg.times, msg.total_s)
            self._tell_all(msg)
        elif isinstance(msg, CoreReady):
            handle.ready.set()
            self._core_ready = True
            log.info("engine core %d ready (pid %s); linking %d front ends", handle.generation, handle.pid,
                     sum(not f.gone for f in self._fronts.values()))  # fmt: skip
            for front in self._fronts.values():
                self._link(front)
        elif isinstance(msg, CoreStartFailed):
            handle.error = msg.error
        elif not isinstance(msg, CoreSnapshot):
            log.error("supervisor: unexpected message %s from the core", type(msg).__name__)

    def _tell_all(self, msg: Any) -> None:
        for front in self._fronts.values():
            if not front.gone:
                with contextlib.suppress(OSError):  # it is ending: its sentinel says so
                    front.link.send(msg)

    def _link(self, front: _FrontEnd) -> None:
        """Link `front` to the running core: one end of a new pair to each."""
        core, door = self._core, self._door
        if front.gone or core is None or door is None or not self._core_ready or core.pid is None:
            return
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            door.send(front.index, fds=(mine.fileno(),))
            front.link.send(CoreAttach(core.generation, core.pid), fds=(theirs.fileno(),))
        except OSError as e:
            log.warning("could not link front end %d to the engine core: %s", front.index, e)
        finally:
            mine.close()
            theirs.close()

    def _core_ended(self, handle: CoreHandle) -> None:
        self._call_on_loop(self._on_core_end, handle)

    def _on_core_end(self, handle: CoreHandle) -> None:
        if handle is not self._core:
            return
        code = handle.process.exitcode
        if self._door is not None:
            self._door.close()
            self._door = None
        if not self._core_ready:
            error = handle.error or f"the engine core ended while starting (exit code {code})"
            if self._stopping:
                return
            first = self._generation == 1
            log.error("the engine core could not %s: %s", "start" if first else "be restarted", error)
            self._tell_all(CoreFailed(error))
            if first:
                self._code = 1
                self._finish()
            return
        self._core_ready = False
        refusal = None if not self._stopping else "the server is shutting down"
        refusal = refusal or self._budget.refusal()
        failure = RESTARTING if refusal is None else STOPPED
        log.error("the engine core (pid %s) ended (exit code %s); %s", handle.pid, code,
                  "restarting it" if refusal is None else f"not restarting it: {refusal}")  # fmt: skip
        self._tell_all(CoreLost(handle.generation, failure, refusal is None))
        if refusal is None:
            count = self._budget.spend()
            b = self._budget
            log.warning("restarting the engine core (%d of %d in %.0f s)", count, b.max_restarts, b.window_s)
            self._start_core()

    # -- the front ends

    def _start_front(self, index: int) -> None:
        assert self._sock is not None and self._source is not None and self._tally is not None
        mine, theirs = PacketLink.pair()
        spec = FrontEndSpec(
            self.profile, index, self.count, self._host, self._level, self._keys, self._source, os.getpid()
        )
        process = self._ctx.Process(
            target=front_end_main,
            args=(spec, self._sock, theirs, self._tally),
            name=f"omnivoice-front-{index}",
        )
        process.start()
        theirs.close()
        front = _FrontEnd(index, process, PacketLink(mine))
        self._fronts[index] = front
        assert self._loop is not None
        self._loop.add_reader(front.link.fileno(), self._from_front, front)
        self._loop.add_reader(process.sentinel, self._front_ended, front)
        log.info("front end %d started (pid %s)", index, process.pid)
        self._link(front)  # a front end started again: the core is running

    def _from_front(self, front: _FrontEnd) -> None:
        for msg, _ in front.link.recv_available():
            if isinstance(msg, FrontEndUp):
                front.up = True
                log.info("front end %d serving (pid %d)", msg.index, msg.pid)
                self._announce()
            elif isinstance(msg, Ask):
                self._ask(front, msg)
            elif isinstance(msg, Answer):
                self._answer(front.index, msg)
            else:
                log.error(
                    "supervisor: unexpected message %s from front end %d", type(msg).__name__, front.index
                )
        if front.link.ended:
            self._unwatch_front(front, sentinel=False)

    def _announce(self) -> None:
        if self._announced or not all(f.up for f in self._fronts.values()):
            return
        self._announced = True
        assert self._sock is not None
        bound = self._sock.getsockname()[1]
        log.info(
            "omnivoice serving %s on http://%s:%d (%d front ends)",
            self.profile.model.served_name, self._host, bound, self.count,
        )  # fmt: skip

    def _front_ended(self, front: _FrontEnd) -> None:
        front.process.join(1.0)
        code = front.process.exitcode
        self._unwatch_front(front)
        front.gone = True
        for key in [k for k in self._questions if k[0] == front.index]:
            self._questions.pop(key, None)
        for key, q in list(self._questions.items()):
            if front.index in q.waiting:
                q.waiting.discard(front.index)
                self._maybe_answer(key)
        if self._stopping or self._done is None or self._done.is_set():
            if all(f.gone for f in self._fronts.values()):
                self._finish()
            return
        if not front.up and not self._announced:
            # failed before it ever served (its engine did not start, say): the server does not start
            log.error("front end %d ended before it served (exit code %s); shutting down", front.index, code)
            self._code = 1
            self._finish()
            return
        refusal = self._front_budget.refusal()
        if refusal is not None:
            log.error(
                "front end %d ended (exit code %s); not starting it again: %s", front.index, code, refusal
            )
            if all(f.gone for f in self._fronts.values()):
                self._code = 1
                self._finish()
            return
        self._front_budget.spend()
        log.error(
            "front end %d ended (exit code %s); its sessions are gone; starting it again", front.index, code
        )
        self._start_front(front.index)

    def _unwatch_front(self, front: _FrontEnd, sentinel: bool = True) -> None:
        assert self._loop is not None
        for fd in (front.link.fileno(), front.process.sentinel if sentinel else -1):
            if fd >= 0:
                with contextlib.suppress(OSError, ValueError):
                    self._loop.remove_reader(fd)
        if sentinel:
            front.link.close()

    # -- questions between front ends

    def _ask(self, asker: _FrontEnd, ask: Ask) -> None:
        others = {f.index for f in self._fronts.values() if f.index != asker.index and not f.gone}
        key = (asker.index, ask.seq)
        q = self._questions[key] = _Question(asker.index, others)
        for index in list(others):
            try:
                self._fronts[index].link.send(Ask(ask.seq, ask.query, origin=asker.index))
            except OSError:
                q.waiting.discard(index)
        assert self._loop is not None
        q.timer = self._loop.call_later(ANSWER_TIMEOUT_S, self._send_answers, key)
        self._maybe_answer(key)

    def _answer(self, index: int, answer: Answer) -> None:
        key = (answer.origin, answer.seq)
        q = self._questions.get(key)
        if q is None or index not in q.waiting:
            return
        q.waiting.discard(index)
        q.answers.append(answer.value)
        self._maybe_answer(key)

    def _maybe_answer(self, key: tuple[int, int]) -> None:
        q = self._questions.get(key)
        if q is not None and not q.waiting:
            self._send_answers(key)

    def _send_answers(self, key: tuple[int, int]) -> None:
        q = self._questions.pop(key, None)
        if q is None:
            return
        if q.timer is not None:
            q.timer.cancel()
        front = self._fronts.get(q.origin)
        if front is not None and not front.gone:
            with contextlib.suppress(OSError):
                front.link.send(Answers(key[1], tuple(q.answers)))

    # -- stopping

    def _on_signal(self, sig: int) -> None:
        self._signals += 1
        name = signal.Signals(sig).name
        if self._signals == 1:
            log.info("%s: draining the %d front ends", name, self.count)
            self._stopping = True
            self._budget.hold()
        else:
            log.warning("%s again: passing it on to the front ends", name)
        self._tell_all(Stop())
        if all(f.gone for f in self._fronts.values()):
            self._finish()

    def _finish(self) -> None:
        if self._done is not None:
            self._done.set()

    async def _stop_all(self) -> None:
        self._stopping = True
        self._budget.hold()
        deadline = time.monotonic() + self.profile.server.drain_timeout_s + STOP_GRACE_S
        for front in self._fronts.values():
            if front.process.is_alive():
                if not self._signals:  # the core failed: the front ends stop at once
                    with contextlib.suppress(OSError):
                        front.link.send(Stop())
                left = max(0.0, deadline - time.monotonic())
                await asyncio.to_thread(front.process.join, left)
                if front.process.is_alive():
                    log.warning("front end %d did not stop in time; killing it", front.index)
                    front.process.kill()
                    await asyncio.to_thread(front.process.join, 5.0)
            self._unwatch_front(front)
        core = self._core
        if core is not None:
            await asyncio.to_thread(core.stop, 30.0)
        if self._door is not None:
            self._door.close()
        if self._sock is not None:
            self._sock.close()
        log.info("omnivoice stopped")

    def _call_on_loop(self, fn: Any, *args: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            fn(*args)
        else:
            loop.call_soon_threadsafe(fn, *args)


def serve_fleet(profile: Profile, host: str, port: int, log_level: str, keys: ApiKeys) -> int:
    """Run the supervisor until it stops; its exit code."""
    return asyncio.run(Supervisor(profile, host, port, log_level, keys).run())
