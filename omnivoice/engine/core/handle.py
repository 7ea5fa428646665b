"""One engine core process as the server holds it: the process, the channel each way, and a reader
thread that hands what the core sends to the client, then says when the process has ended.

The reader also watches the core: once it is ready it sends a snapshot several times a second
(engine/core/outbox.py), so a core silent for `stuck_after_s` is stuck (a wait that never ends, a
stopped process) and is killed; the client then starts a fresh one.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
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
    ) -> None:
        ctx = mp.get_context("spawn")
        self.generation = generation
        self.inbox = ShmConnector(ctx)  # client -> core
        self.channel = PipeConnector(ctx)  # core -> client
        self.process = ctx.Process(
            target=core_process_main,
            args=(profile, source, self.inbox, self.channel, os.getpid()),
            name=f"omnivoice-core-{generation}",
        )
        self.ready = threading.Event()  # set once the core is ready, or has failed to start
        self.error: str | None = None  # why it did not start
        self.last_heard = time.monotonic()
        self._stuck_after_s = profile.stages.stuck_after_s
        self._on_message = on_message
        self._on_exit = on_exit
        self._reader = threading.Thread(target=self._read, name=f"core-reader-{generation}", daemon=True)

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
        if threading.current_thread() is not self._reader:
            self._reader.join(10.0)
        self.inbox.close()
        self.channel.close()

    def _read(self) -> None:
        while True:
            try:
                msg = self.channel.get(timeout=POLL_S)
            except (OSError, ValueError, EOFError):  # the channel broke with the process
                msg = None
            if msg is not None:
                self.last_heard = time.monotonic()
                self._on_message(self, msg)
                continue
            if not self.process.is_alive():
                for late in self._drain():
                    self._on_message(self, late)
                self.process.join(1.0)
                self._on_exit(self)
                return
            silent = time.monotonic() - self.last_heard
            if self.ready.is_set() and 0 < self._stuck_after_s < silent:
                log.error(
                    "engine core %d (pid %s) sent nothing for %.0f s; killing it",
                    self.generation, self.pid, silent,
                )  # fmt: skip
                self.kill()
                self.last_heard = time.monotonic()  # not again while it dies

    def _drain(self) -> list[Any]:
        try:
            return self.channel.drain()
        except (OSError, ValueError, EOFError):
            return []
