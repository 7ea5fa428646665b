"""App-scoped resources with a lifetime: the engine (started in the background) and admission."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Literal

from omnivoice.config import Profile
from omnivoice.engine.api import EngineAPI
from omnivoice.engine.start_progress import StartProgress
from omnivoice.server.errors import server_overloaded, service_unavailable, shutting_down
from omnivoice.server.tally import Tally
from omnivoice.types import Capacity, EngineStats

if TYPE_CHECKING:
    from omnivoice.engine.core.client import EngineClient
    from omnivoice.engine.core.launch import CoreLaunch
    from omnivoice.engine.engine import Engine
    from omnivoice.server.drain import Drain

log = logging.getLogger(__name__)

# `Engine.start`, or a stand-in with the same interface (tests): it starts the engine of a profile,
# telling the StartProgress each step of the start (a factory of one parameter is told nothing).
EngineFactory = (
    Callable[[Profile, StartProgress], Awaitable[EngineAPI]] | Callable[[Profile], Awaitable[EngineAPI]]
)


async def start_default_engine(
    profile: Profile, progress: StartProgress, launch: CoreLaunch | None = None
) -> EngineAPI:
    """`Engine.start(profile)`, or with `stages.core: process` an engine client of a core process
    (`EngineClient.start`): the core of `launch` if one was started before the server (`omnivoice
    serve` does), else one started here before the client's heavy imports, so that the core's start
    runs beside them. The model stack (torch, transformers: seconds) is imported in a thread, so that
    neither importing the HTTP layer nor the event loop pays for it."""
    if profile.stages.core == "process":
        if launch is None:
            launch = await asyncio.to_thread(_launch_core, profile)
        client_cls = await asyncio.to_thread(_import_client)
        return await client_cls.start(profile, progress, launch)
    engine_cls = await asyncio.to_thread(_import_engine)
    return await engine_cls.start(profile, progress=progress)


def _launch_core(profile: Profile) -> CoreLaunch:
    from omnivoice.engine.core.launch import CoreLaunch

    return CoreLaunch.begin(profile)


def _call(factory: EngineFactory, profile: Profile, progress: StartProgress) -> Awaitable[EngineAPI]:
    """`factory(profile, progress)`, or `factory(profile)` for a factory of one parameter."""
    try:
        takes_progress = len(inspect.signature(factory).parameters) >= 2
    except (TypeError, ValueError):  # no signature to read: the full form
        takes_progress = True
    if takes_progress:
        return factory(profile, progress)  # type: ignore[call-arg]
    return factory(profile)  # type: ignore[call-arg]


def _import_client() -> type[EngineClient]:
    from omnivoice.engine.core.client import EngineClient

    return EngineClient


def _import_engine() -> type[Engine]:
    from omnivoice.engine.engine import Engine

    return Engine


class EngineLifecycle:
    """Starts the engine in the background so the server answers `/health` (503) while it loads.

    state: starting -> ready | failed -> closed. While starting, `progress` holds the steps of the
    start so far and what the last start says remains (engine/start_progress.py).

    Once `drain` starts, the engine restarts no stage worker that dies (`Engine.hold_restarts`).
    """

    def __init__(self, profile: Profile, factory: EngineFactory, drain: Drain | None = None) -> None:
        self._profile = profile
        self._factory = factory
        self.state: Literal["starting", "ready", "failed", "closed"] = "starting"
        self.engine: EngineAPI | None = None
        self.error: str | None = None
        self.progress = StartProgress()
        self._task: asyncio.Task[None] | None = None
        self._settled = asyncio.Event()
        self._draining = False
        if drain is not None:
            drain.on_start(self._hold_restarts)

    def _hold_restarts(self) -> None:
        self._draining = True
        if self.engine is not None:
            self.engine.hold_restarts()

    def start(self) -> None:
        """Begin loading; call from the app's lifespan (needs a running loop)."""
        self._task = asyncio.create_task(self._run(), name="engine-start")

    async def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            engine = await _call(self._factory, self._profile, self.progress)
        except Exception as e:
            log.exception("engine failed to start")
            self.state, self.error = "failed", f"{type(e).__name__}: {e}"
        else:
            if self.state == "closed":  # shut down while loading
                await engine.close()
                log.info("engine closed: the server shut down while it was starting")
            else:
                self.engine, self.state = engine, "ready"
                if self._draining:  # the drain began while the engine was loading
                    engine.hold_restarts()
                log.info("engine ready in %.1f s", time.perf_counter() - t0)
        finally:
            self._settled.set()

    async def wait_settled(self) -> bool:
        """Wait until the engine is up (True) or failed to start (False)."""
        await self._settled.wait()
        return self.state == "ready"

    def require(self) -> EngineAPI:
        """The running engine, or a 503 APIError."""
        engine = self.engine
        if self.state == "ready" and engine is not None:
            if engine.failure:
                raise service_unavailable(f"the engine failed: {engine.failure}")
            return engine
        if self.state == "starting":
            raise service_unavailable("the model is still loading; retry shortly")
        raise service_unavailable(f"the engine is {self.state}")

    def stats(self) -> EngineStats | None:
        engine = self.engine
        return engine.stats() if self.state == "ready" and engine is not None else None

    def capacity(self) -> Capacity | None:
        """What the engine measures it can serve in real time; None while it is not up."""
        engine = self.engine
        return engine.capacity() if self.state == "ready" and engine is not None else None

    async def close(self) -> None:
        task = self._task
        if task is not None and not task.done():
            # Cancelling would orphan a half-built engine (start runs in a thread); wait for it instead.
            log.info("waiting for the engine to finish starting before closing it")
            self.state = "closed"
            await asyncio.shield(task)
        engine, self.engine, self.state = self.engine, None, "closed"
        if engine is not None:
            await engine.close()
            log.info("engine closed")


class Admission:
    """At most `limit` requests in flight; over it, fail fast with 503 (server_overloaded) instead
    of queueing. While the server drains, nothing new is admitted (503 server_shutting_down).

    Audio streams are admitted against the engine's measured capacity (`capacity`, engine/capacity.py):
    the server promises a stream to each open realtime session (its responses may speak at any time)
    and to each chat request with audio in flight, and refuses one more (503 server_overloaded) when
    the engine could not serve it in real time with the promised ones, or while one of them already
    runs behind real time. A session's responses are within its promise and never refused for it."""

    def __init__(
        self,
        limit: int,
        drain: Drain | None = None,
        capacity: Callable[[], Capacity | None] | None = None,
        tally: Tally | None = None,
    ) -> None:
        """`tally`: where the counts are kept (server/fleet/shared.py: shared by the front ends of
        one server, which then admit against the server's limit together)."""
        self.limit = limit
        self._tally = tally if tally is not None else Tally(("in_flight", "streams"))
        self._drain = drain
        self._capacity = capacity

    @property
    def in_flight(self) -> int:
        """Requests admitted and not yet finished (of every front end)."""
        return int(self._tally["in_flight"])

    @property
    def streams(self) -> int:
        """Promised audio streams: open realtime sessions and chat requests with audio in flight."""
        return int(self._tally["streams"])

    def acquire(self) -> Slot:
        """A slot for one request (a chat request, a realtime response)."""
        self._check_draining()
        if not self._tally.add("in_flight", 1, self.limit):
            raise server_overloaded(
                f"the server is at its limit of {self.limit} concurrent requests; retry shortly"
            )
        return Slot(self, requests=1)

    def promise_stream(self) -> Slot:
        """A stream for a realtime session, held until it ends (its responses take `acquire()`)."""
        self._check_draining()
        slot = Slot(self, requests=0)
        slot.take_stream()
        return slot

    def _check_draining(self) -> None:
        if self._drain is not None and self._drain.draining:
            raise shutting_down()

    def _take_stream(self) -> None:
        """One more promised stream, or 503 server_overloaded if the engine's measured capacity has
        no room for it (checked and counted as one step, across front ends too)."""
        capacity = self._capacity() if self._capacity is not None else None
        with self._tally.locked():
            why = capacity.refusal(self.streams) if capacity is not None else None
            if why is not None:
                raise server_overloaded(why)
            self._tally.add("streams", 1)

    def _release(self, requests: int, streams: int) -> None:
        with self._tally.locked():
            self._tally.add("in_flight", -requests)
            self._tally.add("streams", -streams)


class Slot:
    """What one admission holds (a request's slot, a promised stream); `release()` is idempotent."""

    def __init__(self, admission: Admission, requests: int = 1) -> None:
        self._admission: Admission | None = admission
        self._requests = requests
        self._streams = 0

    def take_stream(self) -> None:
        """Add a promised audio stream to what this holds (a chat request with audio), or raise 503
        server_overloaded if the engine's measured capacity has no room for it."""
        admission = self._admission
        assert admission is not None, "a released slot takes nothing"
        admission._take_stream()
        self._streams += 1

    def release(self) -> None:
        if self._admission is not None:
            self._admission._release(self._requests, self._streams)
            self._admission = None
