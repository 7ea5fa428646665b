"""Twilio Media Streams messages (one WebSocket per call), as typed models.

In: `connected`, `start`, `media`, `dtmf`, `mark`, `stop`. Out: `media`, `mark`, `clear`.
`parse_event(text)` returns one inbound model or raises `TwilioProtocolError`; `media_payload` decodes
and checks a `media` frame's audio. Inbound models ignore fields they do not name: Twilio adds fields
over time, and a call must not fail on one.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from omnivoice.server.session.protocol import has_lone_surrogate

RATE = 8000  # audio/x-mulaw, mono, both directions
FRAME_BYTES = 160  # 20 ms of u-law: the frame Twilio sends and the one we send
MAX_PAYLOAD_BYTES = 1600  # 200 ms: a longer inbound payload is malformed (Twilio sends 20 ms)


class TwilioProtocolError(Exception):
    """A frame the call cannot use; it is logged and dropped, and the call goes on."""


class _In(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class MediaFormat(_In):
    encoding: str = "audio/x-mulaw"
    sample_rate: int = Field(default=RATE, alias="sampleRate")
    channels: int = 1


class StartInfo(_In):
    stream_sid: str | None = Field(None, alias="streamSid")
    account_sid: str | None = Field(None, alias="accountSid")
    call_sid: str | None = Field(None, alias="callSid")
    tracks: list[str] = Field(default_factory=list)
    custom_parameters: dict[str, str] = Field(default_factory=dict, alias="customParameters")
    media_format: MediaFormat = Field(default_factory=MediaFormat, alias="mediaFormat")


class MediaInfo(_In):
    track: str = "inbound"
    chunk: str | int | None = None
    timestamp: str | int | None = None
    payload: str


class DtmfInfo(_In):
    track: str | None = None
    digit: str


class MarkInfo(_In):
    name: str


class _Event(_In):
    sequence_number: str | int | None = Field(None, alias="sequenceNumber")
    stream_sid: str | None = Field(None, alias="streamSid")


class Connected(_In):
    event: Literal["connected"]
    protocol: str | None = None
    version: str | None = None


class Start(_Event):
    event: Literal["start"]
    stream_sid: str = Field(alias="streamSid")
    start: StartInfo


class Media(_Event):
    event: Literal["media"]
    media: MediaInfo


class Dtmf(_Event):
    event: Literal["dtmf"]
    dtmf: DtmfInfo


class Mark(_Event):
    event: Literal["mark"]
    mark: MarkInfo


class Stop(_Event):
    event: Literal["stop"]
    stop: dict[str, Any] | None = None


InboundEvent = Connected | Start | Media | Dtmf | Mark | Stop
EVENTS = ("connected", "start", "media", "dtmf", "mark", "stop")
_ADAPTER: TypeAdapter[InboundEvent] = TypeAdapter(Annotated[InboundEvent, Field(discriminator="event")])


def parse_event(text: str | bytes) -> InboundEvent:
    """One inbound message; raises TwilioProtocolError with a loggable reason."""
    if isinstance(text, bytes):
        raise TwilioProtocolError(f"a binary frame ({len(text)} bytes); Twilio sends JSON text")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise TwilioProtocolError(f"not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise TwilioProtocolError("a message must be a JSON object")
    if has_lone_surrogate(text, data):  # customParameters' instructions would fail every prompt
        raise TwilioProtocolError("a string that is not valid Unicode (an unpaired surrogate escape)")
    kind = data.get("event")
    if kind is None:
        raise TwilioProtocolError("a message without 'event'")
    if kind not in EVENTS:
        raise TwilioProtocolError(f"unknown event {str(kind)[:40]!r}")
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"][1:])
        raise TwilioProtocolError(f"bad {kind} message: {where}: {first['msg']}") from None


def media_payload(media: Media) -> bytes:
    """The frame's u-law bytes; raises TwilioProtocolError on bad base64 or a bad size."""
    try:
        data = base64.b64decode(media.media.payload, validate=True)
    except (binascii.Error, ValueError):
        raise TwilioProtocolError("media payload is not valid base64") from None
    if not 0 < len(data) <= MAX_PAYLOAD_BYTES:
        raise TwilioProtocolError(f"media payload of {len(data)} bytes (1 to {MAX_PAYLOAD_BYTES} expected)")
    return data


# ---- outbound ------------------------------------------------------------------------------------
class _Out(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True)

    def wire(self) -> str:
        return self.model_dump_json(by_alias=True)


class OutMediaInfo(_Out):
    payload: str


class OutMedia(_Out):
    event: Literal["media"] = "media"
    stream_sid: str = Field(alias="streamSid")
    media: OutMediaInfo


class OutMark(_Out):
    event: Literal["mark"] = "mark"
    stream_sid: str = Field(alias="streamSid")
    mark: MarkInfo


class OutClear(_Out):
    event: Literal["clear"] = "clear"
    stream_sid: str = Field(alias="streamSid")


def media_message(stream_sid: str, ulaw: bytes) -> OutMedia:
    payload = OutMediaInfo(payload=base64.b64encode(ulaw).decode("ascii"))
    return OutMedia(stream_sid=stream_sid, media=payload)


def mark_message(stream_sid: str, name: str) -> OutMark:
    return OutMark(stream_sid=stream_sid, mark=MarkInfo(name=name))


def clear_message(stream_sid: str) -> OutClear:
    return OutClear(stream_sid=stream_sid)
