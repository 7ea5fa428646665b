"""The engine client of a front-end process (`server.front_ends` > 1, server/fleet/): an EngineAPI whose
engine core is shared with the other front ends and owned by the server's supervisor.

The supervisor starts the core, watches it and restarts it; each time a core is ready it hands this
process its end of a socket link to it (`core_attached`), and when the core ends it says so
(`core_lost`): the requests in flight here fail with the engine's error, new ones are refused as
restarting, and the sessions stay connected until the next core is attached. The start steps of the
core reach `/health` here as they reach the supervisor. Requests, outputs and snapshots cross the link
as they cross a core process's own channels (engine/core/client.py), read on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omnivoice.config import Profile
from omnivoice.engine.api import STOPPED
from omnivoice.engine.connectors.socket_link import SocketLink
from omnivoice.engine.core.client import EngineClient
from omnivoice.engine.loading import load_served_model
from omnivoice.engine.start_progress import StartProgress
from omnivoice.messages import CoreExpect, StartStep
from omnivoice.models.dummy_source import DummySource

log = logging.getLogger(__name__)


class CoreLink:
    """A core of the supervisor's, as the client holds it: the link, read on the event loop once
    attached (engine/core/client.py's CoreChannel)."""

    def __init__(
        self, generation: int, pid: int, sock: socket.socket, on_message: Callable[[Any, Any], None]
    ) -> None:
        self.generation = generation
        self._pid = pid
        self.link = SocketLink(sock)
        self.ready = threading.Event()
        self.ready.set()  # the supervisor hands over only ready cores
        self.error: str | None = None
        self._on_message = on_message
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def pid(self) -> int | None:
        return self._pid

    def send(self, msg: Any) -> None:
        self.link.put(msg)

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read the link on `loop` (call on the loop)."""
        self._loop = loop
        loop.add_reader(self.link.fileno(), self._readable)

    def _readable(self) -> None:
        try:
            msgs = self.link.read_available()
        except OSError:
            msgs = []
        for msg in msgs:
            self._on_message(self, msg)
        if self.link.ended:  # the core is gone: the supervisor says what follows
            self._unwatch()

    def _unwatch(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(OSError, ValueError):
                loop.remove_reader(self.link.fileno())

    def stop(self, timeout: float = 60.0) -> None:
        """Stop reading and close the link (from any thread); the core itself is the supervisor's."""
        loop = self._loop
        on_loop = False
        with contextlib.suppress(RuntimeError):
            on_loop = asyncio.get_running_loop() is loop
        if loop is not None and not on_loop and loop.is_running():
            done = threading.Event()

            def unwatch() -> None:
                self._unwatch()
                done.set()

            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(unwatch)
                done.wait(timeout)
        else:
            self._unwatch()
        self.link.close()


class LinkedEngineClient(EngineClient):
    """EngineClient of a core shared with other front ends: started by `start`, told of each core by
    the front end's control channel (server/fleet/front_end.py), on the event loop."""

    def __init__(self, profile: Profile, source: Path | DummySource, progress: StartProgress) -> None:
        super().__init__(profile, load_served_model(profile, source), progress)
        self._attached = asyncio.Event()
        self._start_error: str | None = None

    @classmethod
    async def start_linked(
        cls, profile: Profile, source: Path | DummySource, progress: StartProgress
    ) -> LinkedEngineClient:
        """Load what the server needs of the model (in a thread); the caller then hands the control
        channel's core events to the client, and awaits `wait_attached`."""
        client = await asyncio.to_thread(cls, profile, source, progress)
        client._loop = asyncio.get_running_loop()
        client._loop_thread = threading.get_ident()
        return client

    async def wait_attached(self) -> None:
        """Until the first core is attached; RuntimeError if the core could not start."""
        await self._attached.wait()
        if self._start_error is not None:
            self._grammars.close()
            raise RuntimeError(f"the engine core could not start: {self._start_error}")
        log.info("engine core linked (pid %s)", self.core_pid)

    # -- what the supervisor says (on the event loop)

    def core_attached(self, generation: int, pid: int, sock: socket.socket) -> None:
        if self._closed:
            sock.close()
            return
        old = self._handle
        if old is not None:
            old.stop(5.0)
        link = CoreLink(generation, pid, sock, self._on_message)
        self._generation, self._handle = generation, link
        self._heard, self._failure, self._restarting = (None, False), None, False
        assert self._loop is not None
        link.attach(self._loop)
        if self._attached.is_set():
            log.warning("engine core %d linked (pid %s): serving again", generation, pid)
        self._attached.set()

    def core_lost(self, generation: int, failure: str, restarting: bool) -> None:
        handle = self._handle
        if handle is None or handle.generation != generation:
            return
        self._failure, self._restarting = failure, restarting
        self._handle = None
        handle.stop(5.0)
        log.error(
            "the engine core (pid %s) ended; failing %d in-flight requests; %s",
            handle.pid, len(self._pending), "it is restarting" if restarting else "it is not restarted",
        )  # fmt: skip
        self._fail_all(failure)

    def core_failed(self, error: str) -> None:
        """The supervisor could not start a core: the first (the start fails) or a restart."""
        if not self._attached.is_set():
            self._start_error = error
            self._attached.set()
            return
        self._failure, self._restarting = f"{STOPPED} and could not be restarted", False

    def start_step(self, msg: StartStep | CoreExpect) -> None:
        if isinstance(msg, StartStep):
            self._progress.record(msg)
        else:
            self._progress.expect(msg.times, msg.total_s)
