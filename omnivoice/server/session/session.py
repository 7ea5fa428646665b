"""One realtime session: the conversation, the input buffer, VAD, the in-flight response, and the
handlers of the client's events. Created by the connection, one per WebSocket.

Client events are handled one at a time, in order; only a response runs beside them (its own task).
Handlers raise `ProtocolError` for bad input; `handle` turns it into an `error` event and goes on.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
from typing import Any

import numpy as np
from pydantic import ValidationError

from omnivoice.audio.resample import StreamResampler
from omnivoice.audio.vad import SileroVad, VadStream
from omnivoice.audio.wav import AudioDecodeError
from omnivoice.server.errors import APIError
from omnivoice.server.session import items
from omnivoice.server.session import protocol as p
from omnivoice.server.session.conversation import INPUT_RATE, Content, Conversation, Item, new_id
from omnivoice.server.session.input_audio import BufferFull, InputBuffer, SpeechStarted, TurnDetector
from omnivoice.server.session.outbox import Outbox
from omnivoice.server.session.planning import plan_response
from omnivoice.server.session.prompting import build_prompt
from omnivoice.server.session.response import Response, ResponsePlan
from omnivoice.server.session.server_events import error, session_object
from omnivoice.server.session.session_config import SessionPatch, SessionSettings, SettingsError, apply_patch
from omnivoice.types import text_exceeds

log = logging.getLogger(__name__)

MIN_COMMIT_MS = 100
# Appends with more base64 than this (about 0.7 s of 24 kHz pcm16) are decoded and resampled in a worker
# thread: that work grows with the audio, and the event loop serves every other client meanwhile.
OFF_LOOP_AUDIO_CHARS = 32 * 1024


class Session:
    def __init__(
        self, session_id: str, engine: Any, outbox: Outbox, vad: SileroVad, *, profile: Any, admission: Any
    ) -> None:
        self.id = session_id
        self.engine = engine
        self.outbox = outbox
        self.profile = profile
        self._admission = admission
        rt = profile.realtime
        info = engine.info
        self.settings = SessionSettings(voice=info.default_voice)
        self.conversation = Conversation()
        # a committed buffer becomes one audio part, which may not exceed the server's audio limit
        buffer_s = min(rt.max_buffer_seconds, profile.server.max_audio_seconds)
        self.buffer = InputBuffer(int(buffer_s * INPUT_RATE))
        self._vad: VadStream = vad.stream()
        self._detector = TurnDetector(self.settings.turn_detection) if self.settings.turn_detection else None
        self._speech: tuple[str, int] | None = None  # (item id, audio start) of the turn being spoken
        self._in = StreamResampler(self.settings.input_format.sample_rate, INPUT_RATE)
        self._out = StreamResampler(info.sample_rate, self.settings.output_format.sample_rate)
        self.response: Response | None = None
        self._slot: Any = None
        self._deferred_truncates: dict[str, float] = {}  # item id -> audio_end_ms
        self.last_response: Response | None = None
        self._warm_task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def busy(self) -> bool:
        return self.response is not None

    def start(self) -> None:
        self.outbox.put({"type": "session.created", "session": self._session_object()})

    def _session_object(self) -> dict[str, Any]:
        return session_object(self.settings, self.id, self.engine.info.served_name, self.outbox.beta)

    async def handle(self, text: str | bytes) -> None:
        """Handle one client event; bad input becomes an `error` event and the session goes on."""
        event_id = None
        limit = self.profile.realtime.max_event_bytes
        if len(text) > limit:  # characters of a text frame: bytes for the JSON of any real event
            message = f"the event is {len(text)} bytes; the limit is {limit} (realtime.max_event_bytes)"
            self.outbox.put(error(message, "event_too_large"))
            return
        try:
            event = p.parse_client_event(text)
            event_id = event.event_id
            await self._dispatch(event)
        except p.ProtocolError as e:
            self.outbox.put(error(e.message, e.code, e.param, e.event_id or event_id))
        except Exception:
            log.exception("session %s: handling an event failed", self.id)
            self.outbox.put(error("internal server error", "internal_error", None, event_id, "server_error"))

    async def _dispatch(self, e: p.ClientEvent) -> None:
        if isinstance(e, p.AudioAppend):
            await self._append(e)
        elif isinstance(e, p.SessionUpdate):
            self._update(e)
        elif isinstance(e, p.AudioCommit):
            self._commit_manual(e)
        elif isinstance(e, p.AudioClear):
            self._clear()
        elif isinstance(e, p.ResponseCreate):
            self._create_response(e)
        elif isinstance(e, p.ResponseCancel):
            await self._cancel_response(e)
        elif isinstance(e, p.OutputAudioClear):
            self.outbox.clear_output(self.response.id if self.response else None)
        else:
            await items.handle(self, e)

    # ---- session.update ------------------------------------------------------------------------
    def _update(self, e: p.SessionUpdate) -> None:
        self.apply_settings(e.session, e.event_id)
        self.outbox.put({"type": "session.updated", "session": self._session_object()})

    def apply_settings(self, session: dict[str, Any], event_id: str | None = None) -> None:
        """Validate and apply a `session.update` object (nothing applies if any of it is bad: raises
        ProtocolError). Also called before `start()` with a client secret's session settings."""
        try:
            patch = SessionPatch.model_validate(session)
        except ValidationError as err:
            raise p.session_patch_error(err, event_id) from None
        info = self.engine.info
        if patch.instructions and text_exceeds([patch.instructions], info.max_prompt_chars):
            raise items.too_long("session.instructions", len(patch.instructions), self, event_id)
        try:
            new = apply_patch(self.settings, patch, info.voices, info.default_voice)
        except SettingsError as err:
            raise p.ProtocolError(str(err), "invalid_value", err.param, event_id) from None
        old, self.settings = self.settings, new
        if new.input_format != old.input_format:
            self._in = StreamResampler(new.input_format.sample_rate, INPUT_RATE)
        if new.output_format != old.output_format:
            self._out = StreamResampler(info.sample_rate, new.output_format.sample_rate)
        if new.turn_detection != old.turn_detection:
            position = self._detector.next_frame if self._detector else self.buffer.end
            if self._detector is None:
                self._vad.reset()
            self._detector = TurnDetector(new.turn_detection, position) if new.turn_detection else None
            self._speech = None

    # ---- input audio ---------------------------------------------------------------------------
    async def _append(self, e: p.AudioAppend) -> None:
        fmt = self.settings.input_format
        seconds = self.buffer.max_samples / INPUT_RATE
        if len(e.audio) * 3 // 4 > int(fmt.sample_rate * fmt.bytes_per_sample * seconds):
            message = f"the audio is longer than the input buffer's limit of {seconds:g} s"
            raise p.ProtocolError(message, "input_audio_buffer_too_large", "audio", e.event_id)
        if len(e.audio) > OFF_LOOP_AUDIO_CHARS:  # events are handled one at a time: _in is ours meanwhile
            pcm = await asyncio.to_thread(self._decode_input, e.audio, e.event_id)
        else:
            pcm = self._decode_input(e.audio, e.event_id)
        await self.append_audio(pcm, e.event_id)

    async def append_audio(self, pcm: np.ndarray, event_id: str | None = None) -> None:
        """Append mono float32 audio at 16 kHz and run turn detection. The WebSocket decodes and
        resamples `input_audio_buffer.append`; WebRTC feeds the microphone track here."""
        seconds = self.buffer.max_samples / INPUT_RATE
        if self._detector is not None and not self._detector.speaking:
            self.buffer.trim(self.buffer.end - self._keep_while_idle())
        try:
            self.buffer.append(pcm)
        except BufferFull:
            message = f"the input audio buffer is full ({seconds:g} s); commit or clear it"
            raise p.ProtocolError(message, "input_audio_buffer_full", "audio", event_id) from None
        if self._detector is not None and pcm.size:
            probs = await asyncio.to_thread(self._vad.process, pcm)
            for ev in self._detector.update(probs):
                if isinstance(ev, SpeechStarted):
                    await self._speech_started(ev.position)
                else:
                    self._speech_stopped(ev.position)

    def _decode_input(self, audio: str, event_id: str | None) -> np.ndarray:
        """An append's base64 audio as float32 PCM at the input rate."""
        try:
            raw = base64.b64decode(audio, validate=True)
            pcm = self.settings.input_format.decode(raw)
        except (binascii.Error, ValueError) as err:
            message = str(err) if isinstance(err, AudioDecodeError) else "the audio is not valid base64"
            raise p.ProtocolError(message, "invalid_value", "audio", event_id) from None
        return self._in.process(pcm)

    def _keep_while_idle(self) -> int:
        td = self.settings.turn_detection
        return int((td.prefix_padding_ms if td else 0) * INPUT_RATE / 1000) + 4 * 512

    async def _speech_started(self, position: int) -> None:
        td = self.settings.turn_detection
        assert td is not None
        start = max(self.buffer.start, position - td.prefix_padding_ms * INPUT_RATE // 1000)
        self._speech = (new_id("item"), start)
        self.outbox.put(
            {
                "type": "input_audio_buffer.speech_started",
                "audio_start_ms": start * 1000 // INPUT_RATE,
                "item_id": self._speech[0],
            }
        )
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
            built = await build_prompt(self.engine, self.conversation, self.settings.instructions)
            if not isinstance(built, str):
                await self.engine.warm(built[0], self.id)
        except Exception:
            log.warning("session %s: early prefill failed", self.id, exc_info=True)
        finally:
            self._warm_task = None

    def _truncate_played(self, item_id: str) -> None:
        """A finished response whose playout the server cut short keeps only what was played."""
        item = self.conversation.get(item_id)
        if item is not None and item.ledger is not None:
            items.apply_truncate(self, item, item.ledger.sent_ms)

    def _speech_stopped(self, position: int) -> None:
        if self._speech is None:
            return
        item_id, start = self._speech
        self._speech = None
        self.outbox.put(
            {
                "type": "input_audio_buffer.speech_stopped",
                "audio_end_ms": position * 1000 // INPUT_RATE,
                "item_id": item_id,
            }
        )
        audio = self.buffer.take(start, position)
        item = self._commit(item_id, audio)
        td = self.settings.turn_detection
        self._turn_ended(item, create_response=bool(td and td.create_response))

    def _turn_ended(self, item: Item, create_response: bool) -> None:
        """A user turn has ended (server VAD): respond. The conversation before it was prefilled into
        the engine's prefix cache when the speech started (`_warm`); feeding the user's audio while it
        is still being spoken would hook in `_append`."""
        if not create_response:
            return
        if self.response is not None:
            log.info("session %s: turn %s ended while a response runs; no new response", self.id, item.id)
            return
        self._start_response(plan_response(self, None, None))

    def _commit_manual(self, e: p.AudioCommit) -> None:
        pcm = self._in.flush()
        if pcm.size:
            self.buffer.append(pcm[: max(0, self.buffer.max_samples - self.buffer.samples)])
        if self.buffer.samples * 1000 < MIN_COMMIT_MS * INPUT_RATE:
            ms = self.buffer.samples * 1000 / INPUT_RATE
            message = (
                f"Error committing input audio buffer: buffer too small. Expected at least "
                f"{MIN_COMMIT_MS}ms of audio, but buffer only has {ms:.2f}ms of audio."
            )
            raise p.ProtocolError(message, "input_audio_buffer_commit_empty", None, e.event_id)
        item_id = self._speech[0] if self._speech else new_id("item")
        self._speech = None
        audio = self.buffer.take(self.buffer.start, self.buffer.end)
        if self._detector is not None:
            self._detector.reset(self._detector.next_frame)
        self._commit(item_id, audio)

    def _commit(self, item_id: str, audio: np.ndarray) -> Item:
        item = Item(item_id, "user", [Content("input_audio", audio=audio)])
        prev = self.conversation.insert(item)
        self.outbox.put(
            {"type": "input_audio_buffer.committed", "previous_item_id": prev, "item_id": item_id}
        )
        self.outbox.put({"type": "conversation.item.added", "previous_item_id": prev, "item": item.wire()})
        self.outbox.put({"type": "conversation.item.done", "previous_item_id": prev, "item": item.wire()})
        return item

    def _clear(self) -> None:
        self.buffer.clear()
        self._speech = None
        self._in.reset()
        self._vad.reset()
        if self._detector is not None:
            self._detector.reset(self.buffer.end)
        self.outbox.put({"type": "input_audio_buffer.cleared"})

    # ---- responses -----------------------------------------------------------------------------
    def _create_response(self, e: p.ResponseCreate) -> None:
        if self.response is not None:
            message = f"Conversation already has an active response in progress: {self.response.id}."
            raise p.ProtocolError(message, "conversation_already_has_active_response", None, e.event_id)
        self._start_response(plan_response(self, e.response, e.event_id))

    def _start_response(self, plan: ResponsePlan) -> None:
        resampler = self._out
        if plan.output_format.sample_rate != resampler.out_rate:  # a per-response format override
            resampler = StreamResampler(self.engine.info.sample_rate, plan.output_format.sample_rate)
        resampler.reset()
        response = Response(
            session_id=self.id,
            engine=self.engine,
            outbox=self.outbox,
            conversation=self.conversation,
            plan=plan,
            resampler=resampler,
            ahead_s=self.profile.realtime.max_audio_ahead_ms / 1000,
            on_done=self._response_done,
        )
        try:
            self._slot = self._admission.acquire()
        except APIError as err:  # at the server's request limit, or shutting down: refused at once
            code = err.code or "server_error"
            log.info("session %s: response refused: %s", self.id, err.message)
            response.status = "failed"
            response.status_details = {
                "type": "failed",
                "error": {"type": err.type, "code": code, "message": err.message},
            }
            self.outbox.put({"type": "response.created", "response": response.wire()})
            self.outbox.put(error(err.message, code, type_=err.type))
            self.outbox.put({"type": "response.done", "response": response.wire()})
            return
        self.response = response
        response.start()

    def _response_done(self, response: Response) -> None:
        if self.response is response:
            self.response = None
        self.last_response = response
        if self._slot is not None:
            self._slot.release()
            self._slot = None
        item = response.item
        if item is not None and item.id in self._deferred_truncates:
            items.apply_truncate(self, item, self._deferred_truncates.pop(item.id))

    def defer_truncate(self, item_id: str, audio_end_ms: float) -> None:
        self._deferred_truncates[item_id] = audio_end_ms

    async def _cancel_response(self, e: p.ResponseCancel) -> None:
        r = self.response
        if r is None or (e.response_id is not None and e.response_id != r.id):
            what = f"response {e.response_id!r}" if e.response_id else "a response"
            raise p.ProtocolError(
                f"Cancellation failed: no active {what} found", "response_cancel_not_active", None, e.event_id
            )
        await r.cancel("client_cancelled")

    async def close(self) -> None:
        """The client left: abort the in-flight response in every stage, free the cached prefix.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.response is not None:
            await self.response.cancel("client_cancelled")
        if self._warm_task is not None:
            self._warm_task.cancel()
            await asyncio.gather(self._warm_task, return_exceptions=True)
        self.engine.forget(self.id)
