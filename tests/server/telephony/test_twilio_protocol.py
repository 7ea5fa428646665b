"""Twilio Media Streams messages: the inbound ones exactly as Twilio documents them, bad frames, and the
outbound wire shapes."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from omnivoice.server.telephony import twilio_protocol as tw

SID = "MZ18ad3ab5a668481ce02b83e7395059f0"

# the examples of Twilio's Media Streams docs ("WebSocket Messages"), byte for byte in structure
CONNECTED = '{"event": "connected", "protocol": "Call", "version": "1.0.0"}'
START: dict[str, Any] = {
    "event": "start",
    "sequenceNumber": "1",
    "start": {
        "accountSid": "AC123",
        "streamSid": SID,
        "callSid": "CA123",
        "tracks": ["inbound"],
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        "customParameters": {"FirstName": "Jane", "voice": "chelsie"},
    },
    "streamSid": SID,
}
MEDIA: dict[str, Any] = {
    "event": "media",
    "sequenceNumber": "3",
    "media": {"track": "inbound", "chunk": "1", "timestamp": "5", "payload": "no+JhoaJjpzSHxAKBgYJ"},
    "streamSid": SID,
}
DTMF: dict[str, Any] = {
    "event": "dtmf",
    "streamSid": SID,
    "sequenceNumber": "5",
    "dtmf": {"track": "inbound_track", "digit": "1"},
}
MARK: dict[str, Any] = {
    "event": "mark",
    "sequenceNumber": "4",
    "streamSid": SID,
    "mark": {"name": "my label"},
}
STOP: dict[str, Any] = {
    "event": "stop",
    "sequenceNumber": "5",
    "streamSid": SID,
    "stop": {"accountSid": "AC123", "callSid": "CA123"},
}


def test_parses_every_documented_message() -> None:
    assert isinstance(tw.parse_event(CONNECTED), tw.Connected)
    start = tw.parse_event(json.dumps(START))
    assert isinstance(start, tw.Start) and start.stream_sid == SID and start.start.call_sid == "CA123"
    assert start.start.custom_parameters == {"FirstName": "Jane", "voice": "chelsie"}
    assert start.start.media_format == tw.MediaFormat()
    media = tw.parse_event(json.dumps(MEDIA))
    assert isinstance(media, tw.Media) and tw.media_payload(media) == base64.b64decode(
        MEDIA["media"]["payload"]
    )
    dtmf = tw.parse_event(json.dumps(DTMF))
    assert isinstance(dtmf, tw.Dtmf) and dtmf.dtmf.digit == "1"
    mark = tw.parse_event(json.dumps(MARK))
    assert isinstance(mark, tw.Mark) and mark.mark.name == "my label"
    assert isinstance(tw.parse_event(json.dumps(STOP)), tw.Stop)


def test_unknown_fields_are_ignored() -> None:
    media = tw.parse_event(json.dumps({**MEDIA, "new": 1, "media": {**MEDIA["media"], "extra": True}}))
    assert isinstance(media, tw.Media)


@pytest.mark.parametrize(
    ("frame", "needle"),
    [
        ("{", "not valid JSON"),
        ("[1]", "JSON object"),
        (b"\x00", "binary frame"),
        ('{"event": "hangup"}', "unknown event 'hangup'"),
        ('{"sequenceNumber": "1"}', "without 'event'"),
        (json.dumps({**START, "start": {"tracks": "inbound"}}), "start.tracks"),
        (json.dumps({"event": "start", "start": {}}), "streamSid: Field required"),
        (json.dumps({**MEDIA, "media": {"track": "inbound"}}), "media.payload: Field required"),
        (json.dumps({**MARK, "mark": {}}), "mark.name"),
    ],
)
def test_malformed_frames_say_why(frame: str | bytes, needle: str) -> None:
    with pytest.raises(tw.TwilioProtocolError) as exc:
        tw.parse_event(frame)
    assert needle in str(exc.value)


@pytest.mark.parametrize(
    ("payload", "needle"),
    [("***", "base64"), ("", "0 bytes"), (base64.b64encode(bytes(1601)).decode(), "1601 bytes")],
)
def test_bad_payloads(payload: str, needle: str) -> None:
    media = tw.parse_event(json.dumps({**MEDIA, "media": {**MEDIA["media"], "payload": payload}}))
    assert isinstance(media, tw.Media)
    with pytest.raises(tw.TwilioProtocolError) as exc:
        tw.media_payload(media)
    assert needle in str(exc.value)


def test_outbound_wire_shapes() -> None:
    assert json.loads(tw.media_message(SID, b"\xff\x7f").wire()) == {
        "event": "media",
        "streamSid": SID,
        "media": {"payload": "/38="},
    }
    assert json.loads(tw.mark_message(SID, "ov1").wire()) == {
        "event": "mark",
        "streamSid": SID,
        "mark": {"name": "ov1"},
    }
    assert json.loads(tw.clear_message(SID).wire()) == {"event": "clear", "streamSid": SID}
