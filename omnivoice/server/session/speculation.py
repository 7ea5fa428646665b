"""A speculative response: started when the caller's speech pauses, before server VAD has confirmed
that the turn ended.

Server VAD ends a turn only once `silence_duration_ms` of silence has passed; a response started then
makes the caller wait for the window plus the response. A `Speculation` starts the response's engine
request at the pause instead, prompted with the conversation and the turn's audio so far (the user item
the turn commits if it ends there), and holds every output: nothing reaches the client before the turn
is confirmed. Once the silence has lasted, the response takes the request over (`take`: it is the
response's `EarlyStart`) and streams what was held, then the rest, so the caller waits for the longer
of the two, not their sum. If the caller speaks again first (or a client event changes the session),
the speculation is dropped (`drop`): the request is aborted in every stage, the client never hears of
it, and what it had generated is counted as wasted work. A session's `Speculator` holds its one
speculation at a time and the admission slot it takes, which passes to the response when confirmed.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from omnivoice.engine.api import EngineAPI
from omnivoice.server.errors import APIError
from omnivoice.server.lifecycle import Admission, Slot
from omnivoice.server.session.conversation import Conversation, Item, new_id
from omnivoice.server.session.generation import ResponsePlan, Started, start_generation
from omnivoice.types import AudioChunk, EngineOutput, EngineOverloaded, EngineUnavailable, TextDelta

log = logging.getLogger(__name__)


@dataclass
class SpeculationStats:
    """The speculative responses of an app's sessions since it started (for /metrics and the debug
    state). Once none is in flight, started = confirmed + dropped."""

    started: int = 0
    confirmed: int = 0  # became their turn's response
    dropped: int = 0  # aborted before the turn was confirmed
    wasted_tokens: int = 0  # text tokens the dropped ones had generated
    wasted_audio_s: float = 0.0  # seconds of audio the dropped ones had generated

    def wire(self) -> dict[str, float]:
        return {
            "started": self.started,
            "confirmed": self.confirmed,
            "dropped": self.dropped,
            "wasted_tokens": self.wasted_tokens,
            "wasted_audio_seconds": self.wasted_audio_s,
        }


class Speculation:
    """The response to the turn spoken so far (`item`, not yet in the conversation), started now and held.
    `warm` (the session's early prefill, if running) is waited for first, so that the request reuses
    the prefix it caches rather than racing it."""

    def __init__(
        self,
        *,
        session_id: str,
        engine: EngineAPI,
        conversation: Conversation,
        item: Item,
        plan: ResponsePlan,
        stats: SpeculationStats,
        warm: asyncio.Task[None] | None,
    ) -> None:
        self.response_id = new_id("resp")
        self.item = item
        self.plan = plan
        self._stats = stats
        self._taken = False
        history = conversation.extended(item)
        self._task = asyncio.create_task(
            self._start(engine, session_id, history, warm), name=f"speculation-{self.response_id}"
        )
        stats.started += 1

    async def _start(
        self, engine: EngineAPI, session_id: str, history: Conversation, warm: asyncio.Task[None] | None
    ) -> Started | None:
        if warm is not None:
            await asyncio.wait([warm])  # waits without cancelling it if this task is cancelled
        try:
            made = await start_generation(engine, self.response_id, session_id, self.plan, history)
        except (EngineOverloaded, EngineUnavailable):  # the confirmed response is refused with the reason
            return None
        except Exception:
            log.warning("session %s: speculative response failed to start", session_id, exc_info=True)
            return None
        return None if isinstance(made, str) else made  # the response reports why, if confirmed

    @property
    def held(self) -> tuple[EngineOutput, ...]:
        """What the request has generated so far, held for the response (empty until it has started)."""
        started = self._started()
        return started.ahead.held if started is not None else ()

    def _started(self) -> Started | None:
        task = self._task
        if not task.done() or task.cancelled() or task.exception() is not None:
            return None
        return task.result()

    def confirm(self) -> None:
        """The turn ended where the speculation started: it becomes the turn's response."""
        self._stats.confirmed += 1

    async def take(self) -> Started | None:
        """The request under way, handed to the confirmed response; None if it could not start."""
        try:
            started = await self._task
        except asyncio.CancelledError:  # the response was cancelled while the request was starting
            await self._abandon()
            raise
        self._taken = True
        return started

    async def close(self) -> None:
        """Abort the request unless a response took it."""
        if not self._taken:
            await self._abandon()

    async def drop(self) -> None:
        """The turn was not confirmed: abort the request in every stage and count its outputs as wasted
        work; nothing was or will be sent for it."""
        await self._abandon()
        stats = self._stats
        stats.dropped += 1
        for out in self.held:
            if isinstance(out, TextDelta):
                stats.wasted_tokens += len(out.token_ids)
            elif isinstance(out, AudioChunk):
                stats.wasted_audio_s += out.pcm.size / out.sample_rate

    async def _abandon(self) -> None:
        self._taken = True  # once: a later close() has nothing left to do
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        started = self._started()
        if started is not None:
            await started.ahead.aclose()  # what it held stays readable (`held`)


class Speculator:
    """One session's speculative response, at most one at a time, and its slot among the server's
    requests in flight (`admission`); `stats` are the app's counters."""

    def __init__(
        self, session_id: str, engine: EngineAPI, admission: Admission, stats: SpeculationStats
    ) -> None:
        self._session_id = session_id
        self._engine = engine
        self._admission = admission
        self._stats = stats
        self._current: tuple[Speculation, Slot] | None = None

    @property
    def current(self) -> Speculation | None:
        return self._current[0] if self._current is not None else None

    def start(
        self, conversation: Conversation, item: Item, plan: ResponsePlan, warm: asyncio.Task[None] | None
    ) -> None:
        """Start the response to `conversation` plus `item` (the turn so far), unless one is held or
        the server is at its request limit (the turn's response then asks again once confirmed)."""
        if self._current is not None:
            return
        try:
            slot = self._admission.acquire()
        except APIError:
            return
        spec = Speculation(
            session_id=self._session_id,
            engine=self._engine,
            conversation=conversation,
            item=item,
            plan=plan,
            stats=self._stats,
            warm=warm,
        )
        self._current = (spec, slot)

    def confirm(self) -> tuple[Speculation, Slot] | None:
        """The turn ended: the speculation (now the turn's response's) and its slot, or None."""
        current, self._current = self._current, None
        if current is not None:
            current[0].confirm()
        return current

    async def drop(self) -> None:
        """Drop the speculation, if any, and give back its slot."""
        current, self._current = self._current, None
        if current is None:
            return
        spec, slot = current
        try:
            await spec.drop()
        finally:
            slot.release()
