"""A session's response in flight, one at a time: its start with a slot among the server's requests in
flight (or the one its speculative start already holds), its cancellation, its end, and the truncates
of the item it generates, which wait for that end to apply against the audio really sent."""

from __future__ import annotations

import logging

from omnivoice.audio.resample import StreamResampler
from omnivoice.config import Profile
from omnivoice.engine.api import EngineAPI
from omnivoice.server.errors import APIError
from omnivoice.server.lifecycle import Admission, Slot
from omnivoice.server.session import items
from omnivoice.server.session import protocol as p
from omnivoice.server.session.conversation import Conversation, Item
from omnivoice.server.session.delivery import DeliveryStats
from omnivoice.server.session.generation import ResponsePlan
from omnivoice.server.session.outbox import Outbox
from omnivoice.server.session.response import Response
from omnivoice.server.session.speculation import Speculation

log = logging.getLogger(__name__)


class Responder:
    """Starts and ends a session's responses; `current` is the one in flight, `last` the last one to
    end."""

    def __init__(
        self,
        session_id: str,
        engine: EngineAPI,
        outbox: Outbox,
        conversation: Conversation,
        profile: Profile,
        admission: Admission,
        delivery: DeliveryStats | None = None,
    ) -> None:
        self.session_id = session_id
        self.engine = engine
        self.outbox = outbox
        self.conversation = conversation
        self.profile = profile
        self._admission = admission
        self._delivery = delivery if delivery is not None else DeliveryStats()
        self.current: Response | None = None
        self.last: Response | None = None
        self._slot: Slot | None = None
        self._deferred_truncates: dict[str, float] = {}  # item id -> audio_end_ms

    def start(
        self, plan: ResponsePlan, resampler: StreamResampler, early: tuple[Speculation, Slot] | None = None
    ) -> None:
        """Start a response to `plan`, its audio through `resampler` (the session's output, unless the
        plan asks another rate). `early`: its engine request, started speculatively, and the slot it
        holds."""
        speculation = None
        if early is not None:
            speculation, self._slot = early
        if plan.output_format.sample_rate != resampler.out_rate:  # a per-response format override
            resampler = StreamResampler(self.engine.info.sample_rate, plan.output_format.sample_rate)
        resampler.reset()
        response = Response(
            session_id=self.session_id,
            engine=self.engine,
            outbox=self.outbox,
            conversation=self.conversation,
            plan=plan,
            resampler=resampler,
            ahead_s=self.profile.realtime.max_audio_ahead_ms / 1000,
            on_done=self._done,
            early=speculation,
            delivery=self._delivery,
        )
        if early is None and self.engine.failure:  # a stage died: the engine restarts (or is down)
            code = "engine_restarting" if self.engine.restarting else "engine_failed"
            log.info("session %s: response refused: %s", self.session_id, self.engine.failure)
            response.refuse("server_error", code, f"the engine is unavailable: {self.engine.failure}")
            return
        try:
            if early is None:
                self._slot = self._admission.acquire()
        except APIError as err:  # at the server's request limit, or shutting down: refused at once
            log.info("session %s: response refused: %s", self.session_id, err.message)
            response.refuse(err.type, err.code or "server_error", err.message)
            return
        self.current = response
        response.start()

    async def cancel(self, e: p.ResponseCancel) -> None:
        """`response.cancel`: the response in flight, if it is the one named."""
        r = self.current
        if r is None or (e.response_id is not None and e.response_id != r.id):
            what = f"response {e.response_id!r}" if e.response_id else "a response"
            raise p.ProtocolError(
                f"Cancellation failed: no active {what} found", "response_cancel_not_active", None, e.event_id
            )
        await r.cancel("client_cancelled")

    def truncate(self, item: Item, audio_end_ms: float) -> None:
        """Truncate `item`'s audio at `audio_end_ms`: the item being generated once its response ends,
        against the audio that was really sent."""
        if self.current is not None and item is self.current.item:
            self._deferred_truncates[item.id] = audio_end_ms
        else:
            items.apply_truncate(self.outbox, item, audio_end_ms)

    def _done(self, response: Response) -> None:
        if self.current is response:
            self.current = None
        self.last = response
        self._release_slot()
        item = response.item
        if item is not None and item.id in self._deferred_truncates:
            items.apply_truncate(self.outbox, item, self._deferred_truncates.pop(item.id))

    def _release_slot(self) -> None:
        if self._slot is not None:
            self._slot.release()
            self._slot = None
