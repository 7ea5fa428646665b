"""One realtime session: its settings, conversation, input audio and turns, the in-flight response,
and the handlers of the client's events. Opened by `Sessions` (registry) for every transport: one per
WebSocket, WebRTC call or phone call.

Client events are handled one at a time, in order (a run of appends received together as one append:
`handle_all`); only a response runs beside them (its own task).
Handlers raise `ProtocolError` for bad input; `handle` turns it into an `error` event and goes on.
The input buffer and turn detection are `Turns`' (turns.py); what a turn ends in (a barge-in, a
response) is decided here. With server VAD, a turn's response may start when the speech pauses, held
until the silence window confirms the turn (`Speculation`, speculation.py); speech before then, or any
client event but an audio append (it may change what the response was planned from), drops it. With
`semantic_vad` the end-of-turn model is asked at each pause, the speculative response already started,
and a "done" ends the turn there. The response in flight, its slot and its end are the `Responder`'s
(responding.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any

import numpy as np

from omnivoice.audio.front_door import FrontDoor
from omnivoice.audio.resample import StreamResampler
from omnivoice.audio.vad import SileroVad
from omnivoice.config import Profile
from omnivoice.engine.api import EngineAPI
from omnivoice.server.json_bounds import JsonBounds
from omnivoice.server.lifecycle import Admission, Slot
from omnivoice.server.session import items
from omnivoice.server.session import protocol as p
from omnivoice.server.session.conversation import INPUT_RATE, Conversation, Item
from omnivoice.server.session.delivery import DeliveryStats
from omnivoice.server.session.end_of_turn import TurnJudge
from omnivoice.server.session.generation import ResponsePlan
from omnivoice.server.session.input_audio import (
    InputBuffer,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    TurnEvent,
)
from omnivoice.server.session.intake import IntakeClock, IntakeStats
from omnivoice.server.session.outbox import Outbox
from omnivoice.server.session.planning import plan_response
from omnivoice.server.session.prompting import build_prompt
from omnivoice.server.session.responding import Responder
from omnivoice.server.session.response import Response
from omnivoice.server.session.server_events import error, session_object
from omnivoice.server.session.session_config import SessionSettings
from omnivoice.server.session.speculation import Speculation, SpeculationStats, Speculator
from omnivoice.server.session.transcription import Transcriber
from omnivoice.server.session.turns import RUN_APPENDS, ConvertOne, Run, Turns
from omnivoice.server.session.updating import check_tools, updated_settings
from omnivoice.types import EngineUnavailable

log = logging.getLogger(__name__)


class Session:
    """`admission` gives each response its slot among the server's requests in flight; `speculation`
    counts the speculative responses and `judge` is the end-of-turn model of `semantic_vad` (the app's,
    shared by its sessions; without one, a semantic_vad turn ends at its eagerness's ceiling).
    `front_door` scores the input audio (the app's, shared by its sessions; None: the session's own,
    without worker threads)."""

    def __init__(
        self,
        session_id: str,
        engine: EngineAPI,
        outbox: Outbox,
        vad: SileroVad,
        *,
        profile: Profile,
        admission: Admission,
        speculation: SpeculationStats | None = None,
        judge: TurnJudge | None = None,
        front_door: FrontDoor | None = None,
        intake: IntakeStats | None = None,
        delivery: DeliveryStats | None = None,
    ) -> None:
        self.id = session_id
        self.engine = engine
        self.outbox = outbox
        self.profile = profile
        info = engine.info
        self.settings = SessionSettings(
            voice=info.default_voice, speculative_response=profile.realtime.speculative_response
        )
        evicted = partial(items.announce_deleted, outbox)  # (not a method: no cycle through the session)
        self.conversation = Conversation(profile.realtime.max_conversation_items, evicted)
        # a committed buffer becomes one audio part, which may not exceed the server's audio limit
        buffer_s = min(profile.realtime.max_buffer_seconds, profile.server.max_audio_seconds)
        self.turns = Turns(
            self.settings,
            vad.stream(),
            int(buffer_s * INPUT_RATE),
            self.conversation,
            outbox,
            pause_ms=profile.realtime.speculative_pause_ms,
            log_mel=engine.log_mel,
            window_frames=info.audio_window_frames,
            judge=judge,
            front_door=front_door,
        )
        self._intake = IntakeClock(intake if intake is not None else IntakeStats(), INPUT_RATE)
        self._out = StreamResampler(info.sample_rate, self.settings.output_format.sample_rate)
        tokens = min(profile.realtime.transcription_max_tokens, profile.stages.thinker.max_seq_len)
        self.transcriber = Transcriber(session_id, engine, outbox, tokens, self.conversation.featurizing)
        self.responses = Responder(
            session_id, engine, outbox, self.conversation, profile, admission, delivery
        )
        self._warm_task: asyncio.Task[None] | None = None
        stats = speculation if speculation is not None else SpeculationStats()
        self._speculator = Speculator(session_id, engine, admission, stats)  # the response started early
        self._json_bounds = JsonBounds(profile.server.max_json_elements, profile.server.max_json_depth)
        self._closed = False

    @property
    def response(self) -> Response | None:
        """The response in flight."""
        return self.responses.current

    @property
    def last_response(self) -> Response | None:
        """The last response to end."""
        return self.responses.last

    @property
    def busy(self) -> bool:
        return self.response is not None

    @property
    def speculation(self) -> Speculation | None:
        """The turn's response started when the speech paused, until the turn is confirmed or it is
        dropped."""
        return self._speculator.current

    @property
    def buffer(self) -> InputBuffer:
        """The input audio buffer (`Turns.buffer`)."""
        return self.turns.buffer

    def start(self) -> None:
        self.outbox.put({"type": "session.created", "session": self._session_object()})

    def _session_object(self) -> dict[str, Any]:
        return session_object(self.settings, self.id, self.engine.info.served_name, self.outbox.beta)

    async def handle(self, text: str | bytes) -> None:
        """Handle one client event; bad input becomes an `error` event and the session goes on."""
        event = self._parse(text)
        if event is not None:
            await self._handle_event(event)

    async def handle_all(self, texts: Sequence[str | bytes]) -> None:
        """Handle client events received together (`Receiver.take`), in order, as `handle` would one
        by one, except that each run of consecutive `input_audio_buffer.append`s (up to RUN_APPENDS)
        is appended as one: one front-door job for the run, so a session that fell behind its caller
        catches up in a few steps.
        A bad append of a run gets its own `error` event and adds nothing; the others go on. Between
        events (and runs) the other sessions and requests get the event loop, as when each event was
        read by itself: a client that queued thousands of events holds it no longer than one."""
        run: list[p.AudioAppend] = []
        for text in texts:
            event = self._parse(text)
            if isinstance(event, p.AudioAppend):
                run.append(event)
                if len(run) == RUN_APPENDS:
                    await self._append_run(run)
                    run = []
                    await asyncio.sleep(0)
                continue
            await self._append_run(run)
            run = []
            if event is not None:
                await self._handle_event(event)
            await asyncio.sleep(0)
        await self._append_run(run)

    def _parse(self, text: str | bytes) -> p.ClientEvent | None:
        """The client event of `text`; None (and an `error` event sent) when it is not one."""
        limit = self.profile.realtime.max_event_bytes
        if len(text) > limit:  # characters of a text frame: bytes for the JSON of any real event
            message = f"the event is {len(text)} bytes; the limit is {limit} (realtime.max_event_bytes)"
            self.outbox.put(error(message, "event_too_large"))
            return None
        try:
            return p.parse_client_event(text, self._json_bounds)
        except p.ProtocolError as e:
            self.outbox.put(error(e.message, e.code, e.param, e.event_id))
            return None

    async def _handle_event(self, event: p.ClientEvent) -> None:
        try:
            await self._dispatch(event)
        except p.ProtocolError as e:
            self.outbox.put(error(e.message, e.code, e.param, e.event_id or event.event_id))
        except Exception:
            log.exception("session %s: handling an event failed", self.id)
            failed = error("internal server error", "internal_error", None, event.event_id, "server_error")
            self.outbox.put(failed)

    async def _append_run(self, run: list[p.AudioAppend]) -> None:
        """Append the audio of consecutive appends as one (`handle_all`)."""
        if len(run) <= 1:
            for event in run:
                await self._handle_event(event)
            return
        fitting = []
        for e in run:
            try:
                self.turns.check_append(e)
                fitting.append(e)
            except p.ProtocolError as err:
                self.outbox.put(error(err.message, err.code, err.param, err.event_id))
        if not fitting:
            return
        try:
            refused = await self.append_run([(e.audio, e.event_id) for e in fitting])
        except Exception:
            log.exception("session %s: handling %d appends failed", self.id, len(fitting))
            first = fitting[0].event_id
            self.outbox.put(error("internal server error", "internal_error", None, first, "server_error"))
            return
        for bad in refused:  # the run's appends that were not audio, or did not fit: each its own error
            self.outbox.put(error(bad.message, bad.code, bad.param, bad.event_id))

    async def _dispatch(self, e: p.ClientEvent) -> None:
        if isinstance(e, p.AudioAppend):
            self.turns.check_append(e)
            await self.append_audio(e.audio, e.event_id, self.turns.decoder(e.event_id))
            return
        await self._speculator.drop()  # it was planned from the session and conversation as they were
        if isinstance(e, p.SessionUpdate):
            self.apply_settings(e.session, e.event_id)
            self.outbox.put({"type": "session.updated", "session": self._session_object()})
        elif isinstance(e, p.AudioCommit):
            self._transcribe(self.turns.commit(e.event_id))
        elif isinstance(e, p.AudioClear):
            self.turns.clear()
        elif isinstance(e, p.ResponseCreate):
            self._create_response(e)
        elif isinstance(e, p.ResponseCancel):
            await self.responses.cancel(e)
        elif isinstance(e, p.OutputAudioClear):
            self.outbox.clear_output(self.response.id if self.response else None)
        else:
            await self._item_event(e)

    def apply_settings(self, session: dict[str, Any], event_id: str | None = None) -> None:
        """Validate and apply a `session.update` object (nothing applies if any of it is bad: raises
        ProtocolError). Also called before `start()` with a client secret's session settings."""
        new = updated_settings(self.settings, session, self.engine, event_id)
        old, self.settings = self.settings, new
        if new.output_format != old.output_format:
            self._out = StreamResampler(self.engine.info.sample_rate, new.output_format.sample_rate)
        self.turns.configure(new)

    async def _item_event(self, e: p.ClientEvent) -> None:
        """`conversation.item.*`. A truncate of the item being generated applies once its response
        ends, against the audio that was really sent."""
        conversation, fmt = self.conversation, self.settings.input_format
        generating = self.response.outputs if self.response is not None else []
        if isinstance(e, p.ItemCreate):
            info, max_s = self.engine.info, self.turns.max_seconds
            pixels = self.profile.server.max_image_pixels, self.profile.realtime.max_session_image_pixels
            await items.create(e, conversation, self.outbox, info, fmt, max_s, pixels)
        elif isinstance(e, p.ItemRetrieve):
            item = items.find(conversation, e.item_id, e.event_id)
            self.outbox.put({"type": "conversation.item.retrieved", "item": items.retrieved(item, fmt)})
        elif isinstance(e, p.ItemDelete):
            items.delete(e, conversation, self.outbox, generating)
        elif isinstance(e, p.ItemTruncate):
            self.responses.truncate(items.truncatable(e, conversation), e.audio_end_ms)

    # ---- turns ---------------------------------------------------------------------------------
    async def append_audio(
        self, pcm: Any, event_id: str | None = None, convert: Callable[[Any], np.ndarray] | None = None
    ) -> None:
        """Append mono float32 audio at 16 kHz (or audio that `convert` turns into that, off the event
        loop: `Turns.append`) and act on the turns it starts or ends. The WebSocket's
        `input_audio_buffer.append`, WebRTC and Twilio feed their audio here."""
        await self._heard(await self.turns.append(pcm, event_id, convert))

    async def append_run(self, run: Run, convert: ConvertOne | None = None) -> list[p.ProtocolError]:
        """Append consecutive appends received together (each its audio and event id) as one, and act
        on the turns they start or end (`Turns.append_run`: `convert` is by default an
        `input_audio_buffer.append`'s base64 decoding). Returns the errors of the appends refused."""
        events, refused = await self.turns.append_run(run, convert)
        await self._heard(events)
        return refused

    async def _heard(self, events: Iterator[TurnEvent]) -> None:
        """Act on the turn events of the audio just appended (one append's, or a run's)."""
        self._intake.handled(self.turns.buffer.end)  # how far behind the caller the session is
        for ev in events:
            if isinstance(ev, SpeechStarted):
                self.turns.speech_started(ev.position)
                await self._speech_started()
            elif isinstance(ev, SpeechPaused):
                self._speech_paused(ev.position)  # the response starts while the model decides
                if await self.turns.done_at_pause():  # semantic_vad: the caller is done
                    self._speech_stopped(self.turns.end_turn())
            elif isinstance(ev, SpeechResumed):
                await self._speculator.drop()
            else:
                self._speech_stopped(ev.position)
        if self.turns.ahead:  # whole encoder windows of the turn being spoken: encoded while it goes on
            windows, self.turns.ahead = self.turns.ahead, []
            td = self.settings.turn_detection
            if td is not None and td.create_response:
                self.engine.encode_ahead(self.id, windows)

    def _speech_stopped(self, position: int) -> None:
        """The turn ended at `position`: it commits what the speculative response (if one was started
        at the pause) was prompted with, and that response is confirmed."""
        early = self._speculator.confirm()
        item = self.turns.speech_stopped(position, early[0].item if early else None)
        if item is not None:
            self._turn_ended(item, early)
            self._transcribe(item)

    def _transcribe(self, item: Item) -> None:
        """A committed user turn: transcribe it beside its response (started first), if asked to."""
        if self.settings.transcription is not None:
            self.transcriber.start(item, self.settings.transcription)

    async def _speech_started(self) -> None:
        """The user speaks: a barge-in cuts the response (or the playout) short, and the conversation
        so far is prefilled meanwhile."""
        td = self.settings.turn_detection
        assert td is not None
        if td.interrupt_response:
            in_flight = self.response
            cut = self.outbox.interrupt(in_flight.id if in_flight else None)  # WebRTC: playout stops
            if in_flight is not None:
                await in_flight.cancel("turn_detected")  # its item keeps what was played
            elif cut is not None:
                self._truncate_played(cut)
        if self.response is None and self.conversation.items and self._warm_task is None:
            self._warm_task = asyncio.create_task(self._warm(), name=f"warm-{self.id}")

    async def _warm(self) -> None:
        """Early start: while the user speaks, prefill the conversation so far into the engine's prefix
        cache, so the turn's response prefills only the new audio."""
        try:
            tools = self.settings.tools.for_engine()  # as the turn's response will offer them
            functions = tools.functions if tools is not None else ()
            built = await build_prompt(self.engine, self.conversation, self.settings.instructions, functions)
            if not isinstance(built, str):
                await self.engine.warm(built[0], self.id)
        except EngineUnavailable as e:  # restarting or overloaded: the turn's response says so, if it comes
            log.info("session %s: no early prefill: %s", self.id, e)
        except Exception:
            log.warning("session %s: early prefill failed", self.id, exc_info=True)
        finally:
            self._warm_task = None

    def _truncate_played(self, item_id: str) -> None:
        """A finished response whose playout the server cut short keeps only what was played."""
        item = self.conversation.get(item_id)
        if item is not None and item.ledger is not None:
            items.apply_truncate(self.outbox, item, item.ledger.sent_ms)

    def _speech_paused(self, position: int) -> None:
        """The speech paused: start the turn's response now, prompted with the turn's audio so far and
        held until the turn is confirmed (`_turn_ended`) or dropped (the speech resumes)."""
        td = self.settings.turn_detection
        wanted = self.settings.speculative_response and td is not None and td.create_response
        if not wanted or self.response is not None or self._speculator.current is not None:
            return
        item = self.turns.spoken(position)
        if item is not None:
            self._speculator.start(self.conversation, item, self._plan(None, None), self._warm_task)

    def _turn_ended(self, item: Item, early: tuple[Speculation, Slot] | None) -> None:
        """A user turn has ended (server VAD): respond, with the response started when the speech
        paused (`early`, whose user item is `item`, with its slot) if there is one. The conversation
        before the turn was prefilled into the engine's prefix cache when the speech started (`_warm`),
        and the turn's audio was featurized, and encoded window by window, while it was spoken
        (`append_audio`)."""
        if early is not None:  # only made while no response runs and the turn creates one
            self.responses.start(early[0].plan, self._out, early)
            return
        td = self.settings.turn_detection
        if not (td and td.create_response):
            return
        if self.response is not None:
            log.info("session %s: turn %s ended while a response runs; no new response", self.id, item.id)
            return
        self.responses.start(self._plan(None, None), self._out)

    # ---- responses -----------------------------------------------------------------------------
    def _plan(self, r: p.ResponseParams | None, event_id: str | None) -> ResponsePlan:
        plan = plan_response(self.settings, self.profile.stages, self.engine.info, r, event_id)
        if plan.tools != self.settings.tools:  # the response's own
            check_tools(self.engine, plan.tools, "response.tools", event_id)
        return plan

    def _create_response(self, e: p.ResponseCreate) -> None:
        if self.response is not None:
            message = f"Conversation already has an active response in progress: {self.response.id}."
            raise p.ProtocolError(message, "conversation_already_has_active_response", None, e.event_id)
        self.responses.start(self._plan(e.response, e.event_id), self._out)

    async def close(self) -> None:
        """The client left: abort the in-flight response and transcriptions in every stage, free the
        cached prefix. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self._speculator.drop()
        if self.response is not None:
            await self.response.cancel("client_cancelled")
        if self._warm_task is not None:
            self._warm_task.cancel()
            await asyncio.gather(self._warm_task, return_exceptions=True)
        await self.transcriber.close()
        self.engine.forget(self.id)
