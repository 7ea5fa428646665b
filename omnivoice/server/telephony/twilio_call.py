"""One phone call over Twilio Media Streams: the carrier's messages in, a realtime `Session` behind them.

`start` opens the session (u-law both ways, server VAD with barge-in; `customParameters` choose the
voice, instructions and turn detection), `media` feeds it the caller's audio, echoed `mark`s tell the
outbox what was played, `stop` ends the call. When the caller speaks over the assistant, the session
cancels the response and asks the outbox to `interrupt` (which sends `clear`); the interrupted item
keeps only what the echoed marks say was heard. Messages the call cannot use are logged and dropped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.websockets import WebSocket

from omnivoice.audio.formats import G711_ULAW
from omnivoice.audio.resample import input_resampler
from omnivoice.config import Profile
from omnivoice.server.session.conversation import INPUT_RATE, new_id
from omnivoice.server.session.outbox import Event, OutboxLimits
from omnivoice.server.session.protocol import ProtocolError
from omnivoice.server.session.registry import Ticket
from omnivoice.server.session.session import Session
from omnivoice.server.session.turns import RUN_APPENDS
from omnivoice.server.telephony import twilio_protocol as tw
from omnivoice.server.telephony.twilio_outbox import TwilioOutbox

log = logging.getLogger(__name__)

LOUD_MALFORMED = 20  # malformed frames logged at warning level; then one in every 100


class CallParameters(BaseModel):
    """The `start` message's `customParameters` (the TwiML's <Parameter>s); others are ignored."""

    model_config = ConfigDict(extra="ignore")

    voice: str | None = None
    instructions: str | None = None
    silence_duration_ms: int | None = Field(None, ge=0, le=10_000)  # server_vad
    turn_detection: Literal["server_vad", "semantic_vad"] = "server_vad"
    eagerness: Literal["low", "medium", "high", "auto"] | None = None  # semantic_vad
    max_output_tokens: int | None = Field(None, ge=1)
    # omnivoice extension, for tests and benchmarks on a random-weight model: fixed output lengths
    min_output_tokens: int | None = Field(None, ge=0)
    output_audio_frames: int | None = Field(None, ge=1)
    # omnivoice extension: the speculative start of each turn's response (default: the profile's)
    speculative_response: bool | None = None

    @classmethod
    def parse(cls, raw: dict[str, str]) -> tuple[CallParameters, list[str]]:
        """The valid parameters, and a message for each invalid one (left out)."""
        try:
            return cls.model_validate(raw), []
        except ValidationError as e:
            bad = {str(err["loc"][0]) for err in e.errors()}
            problems = [f"{err['loc'][0]}: {err['msg']}" for err in e.errors()]
            return cls.model_validate({k: v for k, v in raw.items() if k not in bad}), problems

    def session_update(self) -> dict[str, Any]:
        """A `session.update` object: u-law both ways, server VAD (or semantic VAD: the caller's 8 kHz
        audio reaches the end-of-turn model resampled to 16 kHz, as it reaches the VAD) with barge-in,
        these settings. Each turn detection takes its own setting: the other's is left out."""
        vad: dict[str, Any] = {
            "type": self.turn_detection,
            "create_response": True,
            "interrupt_response": True,
        }
        if self.turn_detection == "semantic_vad" and self.eagerness is not None:
            vad["eagerness"] = self.eagerness
        elif self.turn_detection == "server_vad" and self.silence_duration_ms is not None:
            vad["silence_duration_ms"] = self.silence_duration_ms
        ulaw = {"type": "audio/pcmu"}
        out: dict[str, Any] = {
            "type": "realtime",
            "output_modalities": ["audio"],
            "audio": {"input": {"format": ulaw, "turn_detection": vad}, "output": {"format": ulaw}},
        }
        if self.instructions:
            out["instructions"] = self.instructions
        if self.max_output_tokens is not None:
            out["max_output_tokens"] = self.max_output_tokens
        extension = {
            "min_output_tokens": self.min_output_tokens,
            "output_audio_frames": self.output_audio_frames,
            "speculative_response": self.speculative_response,
        }
        if any(v is not None for v in extension.values()):
            out["omnivoice"] = extension
        return out


class TwilioCall:
    """`ticket`: the call's admitted session, opened at `start` and released by `close`."""

    def __init__(self, websocket: WebSocket, ticket: Ticket, profile: Profile) -> None:
        self.id = new_id("call")
        self.stream_sid: str | None = None
        self.call_sid: str | None = None
        self.session: Session | None = None
        self.malformed = 0
        self.digits: list[str] = []
        self._ticket = ticket
        ahead_s = profile.telephony.max_audio_ahead_ms / 1000
        limits = OutboxLimits.of(profile)
        self.outbox = TwilioOutbox(websocket, self.id, self._on_session_event, ahead_s=ahead_s, limits=limits)
        self._in = input_resampler(tw.RATE, INPUT_RATE)  # 8 to 16 kHz: no block hold-back

    @property
    def label(self) -> str:
        """How log lines name this call: its streamSid once known."""
        return self.stream_sid or f"({self.id}, before start)"

    async def handle(self, message: str | bytes) -> bool:
        """Handle one frame from the carrier; False once the call is over (`stop`)."""
        try:
            event = tw.parse_event(message)
        except tw.TwilioProtocolError as e:
            self._malformed(str(e))
            return True
        return await self._handle_event(event)

    async def _handle_event(self, event: tw.InboundEvent) -> bool:
        if isinstance(event, tw.Stop):
            log.info("call %s: stop", self.label)
            return False
        try:
            await self._dispatch(event)
        except tw.TwilioProtocolError as e:
            self._malformed(str(e))
        return True

    async def handle_all(self, messages: Sequence[str | bytes]) -> bool:
        """Handle frames received together (`Receiver.take`), in order, as `handle` would one by one,
        except that each run of consecutive media frames is appended as one (one front-door job: a
        call that fell behind the carrier catches up at once); False once the call is over."""
        run: list[bytes] = []  # u-law bytes of the run's frames
        for message in messages:
            try:
                event = tw.parse_event(message)
                if isinstance(event, tw.Media) and self._inbound(event):
                    run.append(tw.media_payload(event))
                    if len(run) == RUN_APPENDS:
                        await self._append_run(run)
                        run = []
                        await asyncio.sleep(0)  # the other calls and sessions in between
                    continue
            except tw.TwilioProtocolError as e:
                self._malformed(str(e))
                await asyncio.sleep(0)
                continue
            await self._append_run(run)
            run = []
            if not await self._handle_event(event):
                return False
            await asyncio.sleep(0)
        await self._append_run(run)
        return True

    async def _append_run(self, run: list[bytes]) -> None:
        if len(run) <= 1:
            for payload in run:
                await self._append(payload)
            return
        assert self.session is not None
        # G.711 decoded and resampled in the session's worker thread, with the VAD; each frame buffered
        # in turn, so a full buffer drops only the frames past its end
        refused = await self.session.append_run([(f, None) for f in run], lambda f, _: self._decode(f))
        if refused:
            log.warning("call %s: %d frames dropped: %s", self.label, len(refused), refused[0].message)

    async def _dispatch(self, e: tw.InboundEvent) -> None:
        if isinstance(e, tw.Media):
            await self._media(e)
        elif isinstance(e, tw.Mark):
            self._check_stream(e)
            if not self.outbox.playout.echoed(e.mark.name):
                log.debug("call %s: echo of a mark we did not send: %r", self.label, e.mark.name)
        elif isinstance(e, tw.Start):
            await self._start(e)
        elif isinstance(e, tw.Dtmf):
            self._check_stream(e)
            self.digits.append(e.dtmf.digit)
            log.info("call %s: DTMF %r (not acted on)", self.label, e.dtmf.digit)
        elif isinstance(e, tw.Connected):
            log.debug("call %s: connected (%s %s)", self.label, e.protocol, e.version)

    async def _start(self, e: tw.Start) -> None:
        if self.session is not None:
            raise tw.TwilioProtocolError("a second start on one stream")
        info = e.start
        fmt = info.media_format
        if (fmt.encoding, fmt.sample_rate, fmt.channels) != ("audio/x-mulaw", tw.RATE, 1):
            log.warning("call %s: media format %s; treated as audio/x-mulaw 8 kHz mono", e.stream_sid, fmt)
        self.stream_sid, self.call_sid = e.stream_sid, info.call_sid
        self.outbox.stream_sid = e.stream_sid
        params, problems = CallParameters.parse(info.custom_parameters)
        for problem in problems:
            log.warning("call %s: customParameters %s (ignored)", self.label, problem)
        session = self.session = await self._ticket.open(self.outbox)
        self._apply(params.session_update())
        if params.voice:
            self._apply({"audio": {"output": {"voice": params.voice}}})  # a bad voice leaves the rest
        session.start()
        log.info(
            "call %s: started (callSid %s, session %s, voice %s)",
            self.label, self.call_sid, self.id, session.settings.voice,
        )  # fmt: skip

    def _apply(self, settings: dict[str, Any]) -> None:
        assert self.session is not None
        try:
            self.session.apply_settings(settings)
        except ProtocolError as e:
            log.warning("call %s: setting %s refused: %s", self.label, e.param, e.message)

    async def _media(self, e: tw.Media) -> None:
        if self._inbound(e):
            await self._append(tw.media_payload(e))

    def _inbound(self, e: tw.Media) -> bool:
        """Whether the frame is the caller's audio (the only track that feeds the session); raises
        TwilioProtocolError for a frame out of place."""
        if self.session is None:
            raise tw.TwilioProtocolError("media before start")
        self._check_stream(e)
        return e.media.track.startswith("inbound")

    async def _append(self, payload: bytes) -> None:
        assert self.session is not None
        try:  # G.711 decoded and resampled in the session's worker thread, with the VAD
            await self.session.append_audio(payload, convert=self._decode)
        except ProtocolError as err:
            log.warning("call %s: audio dropped: %s", self.label, err.message)

    def _decode(self, payload: bytes) -> np.ndarray:
        return self._in.process(G711_ULAW.decode(payload))

    def _check_stream(self, e: tw.Media | tw.Mark | tw.Dtmf) -> None:
        if self.stream_sid is None:
            raise tw.TwilioProtocolError(f"{e.event} before start")
        if e.stream_sid is not None and e.stream_sid != self.stream_sid:
            raise tw.TwilioProtocolError(f"{e.event} for another stream ({e.stream_sid[:40]!r})")

    def _on_session_event(self, event: Event) -> None:
        """Session events other than audio: Twilio has no wire for them; errors and outcomes are logged."""
        kind = event["type"]
        if kind == "error":
            err = event["error"]
            log.warning("call %s: %s (%s)", self.label, err.get("message"), err.get("code"))
        elif kind == "response.done":
            r = event["response"]
            log.info("call %s: response %s %s", self.label, r["id"], r["status"])
        elif kind == "output_audio_buffer.cleared":
            log.debug("call %s: output cleared", self.label)

    def _malformed(self, reason: str) -> None:
        self.malformed += 1
        loud = self.malformed <= LOUD_MALFORMED or self.malformed % 100 == 0
        level = logging.WARNING if loud else logging.DEBUG
        log.log(level, "call %s: malformed frame dropped (%d so far): %s", self.label, self.malformed, reason)

    async def close(self) -> None:
        """The call ended: abort the response in every stage, free the session's cached prefix and
        give back its slot."""
        await self._ticket.close()
        log.info(
            "call %s ended: %d frames sent, %d marks played, %d malformed frames, DTMF %r",
            self.label, self.outbox.frames_sent, self.outbox.playout.played_marks, self.malformed,
            "".join(self.digits),
        )  # fmt: skip
