"""One engine core process as the server holds it: the process, the channel each way, and the reading
of what the core sends, handed to the client, until the handle says the process has ended.

A reader thread reads from the start (the first core starts before the server has an event loop,
engine/core/launch.py); once the client `attach`es the handle to its loop, the loop reads the pipe
itself whenever it is readable (engine/connectors/pipe.py), so the core's outputs reach their
requests without a thread's hand-over, each needing the GIL, between the two. Whoever reads also
watches the core: once it is ready it sends a snapshot several times a second
(engine/core/outbox.py), so a core silent for `stuck_after_s` is stuck (a wait that never ends, a
stopped process) and is killed; the client then starts a fresh one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing as mp
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omnivoice.config import Profile
from omnivoice.engine.connectors.pipe import PipeConnector
from omnivoice.engine.connectors.shm import ShmConnector
from omnivoice.engine.core.entry import core_process_main
from omnivoice.messages import CloseCore

if TYPE_CHECKING:
    from omnivoice.models.dummy import DummySource

log = logging.getLogger(__name__)

POLL_S = 0.2  # how often the reader looks at the process while the core sends nothing


class CoreHandle:
    def __init__(
        self,
        profile: Profile,
        source: Path | DummySource,
        generation: int,
        on_message: Callable[[CoreHandle, Any], None],
        on_exit: Callable[[CoreHandle], None],
        door: socket.socket | None = None,
    ) -> None:
        """`door`: the core's end of a packet socket on which this process hands it, at run time, its
        ends of links to the server's front-end processes (server/fleet/), which send it requests as
        this process does (None: this process alone)."""
        ctx = mp.get_context("spawn")
        self.generation = generation
        self.inbox = ShmConnector(ctx)  # client -> core
        self.channel = PipeConnector(ctx)  # core -> client
        self.process = ctx.Process(
            target=core_process_main,
            args=(profile, source, self.inbox, self.channel, os.getpid(), door),
            name=f"omnivoice-core-{generation}",
        )
        self.ready = threading.Event()  # set once the core is ready, or has failed to start
        self.error: str | None = None  # why it did not start
        self.last_heard = time.monotonic()
        self._stuck_after_s = profile.stages.stuck_after_s
        self._on_message = on_message
        self._on_exit = on_exit
        self._reader = threading.Thread(target=self._read, name=f"core-reader-{generation}", daemon=True)
        self._handover: asyncio.AbstractEventLoop | None = None  # the loop to read on, once attached
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop reading now
        self._watch: asyncio.TimerHandle | None = None
        self._stopped = False  # stop() was called
        self._ended = False  # the process ended and on_exit was called

    def start(self) -> None:
        self.process.start()
        self.channel.close_writing_end()
        log.info("engine core %d started (pid %s)", self.generation, self.process.pid)
        self._reader.start()

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def send(self, msg: Any) -> None:
        self.inbox.put(msg)

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read the core on `loop` from now on (call once, from any thread): the reader thread hands
        over at its next wake-up, and the loop then reads the pipe whenever it is readable, with no
        thread between the core's messages and their listener, and watches the process every POLL_S."""
        self._handover = loop

    def stop(self, timeout: float = 60.0) -> None:
        """Ask the core to stop its stages and end; kill it if it has not within `timeout`."""
        if self.process.is_alive():
            with contextlib.suppress(OSError, ValueError):
                self.send(CloseCore())
            self.process.join(timeout)
            if self.process.is_alive():
                log.warning("engine core %d did not stop within %.0f s; killing it", self.generation, timeout)
                self.kill()
        self.process.join(10.0)
        self._stopped = True
        if threading.current_thread() is not self._reader:
            self._reader.join(10.0)
        self._detach()
        self.inbox.close()
        self.channel.close()

    # -- reading: a thread until `attach`, then the event loop

    def _read(self) -> None:
        while True:
            loop = self._handover
            if loop is not None:
                try:
                    loop.call_soon_threadsafe(self._read_on_loop, loop)
                    return
                except RuntimeError:  # that loop is closed: go on reading here
                    self._handover = None
            try:
                msg = self.channel.get(timeout=POLL_S)
            except (OSError, ValueError):  # the channel was closed (stop)
                msg = None
            if msg is not None:
                self.last_heard = time.monotonic()
                self._on_message(self, msg)
                continue
            if not self._watch_process():
                return

    def _read_on_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._stopped or self._ended:
            return
        self._loop = loop
        loop.add_reader(self.channel.fileno(), self._readable)
        self._watch = loop.call_later(POLL_S, self._watchdog)
        self._readable()

    def _readable(self) -> None:
        for msg in self._drain():
            self.last_heard = time.monotonic()
            self._on_message(self, msg)
        if self.channel.ended and self._loop is not None:  # the process is ending: the watchdog sees it
            self._loop.remove_reader(self.channel.fileno())

    def _watchdog(self) -> None:
        if self._stopped or self._ended or self._loop is None:
            return
        if self._watch_process():
            self._watch = self._loop.call_later(POLL_S, self._watchdog)
        else:
            self._detach()

    def _watch_process(self) -> bool:
        """Whether the process goes on: once it has ended, hand on what it sent last and say so
        (`on_exit`); a core silent for `stuck_after_s` once ready is killed."""
        if not self.process.is_alive():
            for late in self._drain():
                self._on_message(self, late)
            self._ended = True
            self._on_exit(self)
            return False
        silent = time.monotonic() - self.last_heard
        if self.ready.is_set() and 0 < self._stuck_after_s < silent:
            log.error(
                "engine core %d (pid %s) sent nothing for %.0f s; killing it",
                self.generation, self.pid, silent,
            )  # fmt: skip
            self.kill()
            self.last_heard = time.monotonic()  # not again while it dies
        return True

    def _detach(self) -> None:
        """Stop the loop's reading and watching (on the loop, and waited for from another thread)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        on_loop = False
        with contextlib.suppress(RuntimeError):
            on_loop = asyncio.get_running_loop() is loop
        if on_loop or not loop.is_running():
            self._unwatch()
            return
        done = asyncio.run_coroutine_threadsafe(self._unwatch_async(), loop)
        with contextlib.suppress(Exception):
            done.result(10.0)

    async def _unwatch_async(self) -> None:
        self._unwatch()

    def _unwatch(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        if self._watch is not None:
            self._watch.cancel()
        with contextlib.suppress(OSError, ValueError, AssertionError):
            loop.remove_reader(self.channel.fileno())

    def _drain(self) -> list[Any]:
        try:
            return self.channel.drain()
        except (OSError, ValueError):  # the channel was closed (stop)
            return []
