"""Twilio Media Streams frames for the fuzz tests: Twilio's documented messages with fields dropped,
retyped or added, wrong event names, bad base64 payloads, wrong sequence numbers, and raw garbage.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from hypothesis import strategies as st

from .strategies import json_values, lying_base64, mutated, pick, raw_bytes, raw_text

SID = "MZ18ad3ab5a668481ce02b83e7395059f0"
FRAME = base64.b64encode(b"\xff" * 160).decode()
CONNECTED: dict[str, Any] = {"event": "connected", "protocol": "Call", "version": "1.0.0"}
START: dict[str, Any] = {
    "event": "start", "sequenceNumber": "1", "streamSid": SID,
    "start": {
        "accountSid": "AC123", "streamSid": SID, "callSid": "CA123", "tracks": ["inbound"],
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        "customParameters": {"voice": "chelsie", "instructions": "be brief", "silence_duration_ms": "300",
                             "max_output_tokens": "20", "min_output_tokens": "2", "output_audio_frames": "3"},
    },
}  # fmt: skip
MEDIA: dict[str, Any] = {
    "event": "media", "sequenceNumber": "3", "streamSid": SID,
    "media": {"track": "inbound", "chunk": "1", "timestamp": "5", "payload": FRAME},
}  # fmt: skip
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
VALID: list[dict[str, Any]] = [CONNECTED, START, MEDIA, DTMF, MARK, STOP]

media_frames = st.tuples(
    lying_base64(st.binary(max_size=2000)), st.sampled_from(["inbound", "outbound", "x"])
).map(lambda t: json.dumps({**MEDIA, "media": {**MEDIA["media"], "payload": t[0], "track": t[1]}}))
sequence_numbers = st.sampled_from(["0", "-1", "x", "", "99999999999999999999"]) | json_values
frames = pick(
    st.sampled_from(VALID).flatmap(mutated).map(json.dumps),
    st.sampled_from(VALID).flatmap(mutated).map(json.dumps),
    st.sampled_from(VALID).flatmap(mutated).map(json.dumps),
    media_frames,
    media_frames,
    st.tuples(st.sampled_from(VALID), sequence_numbers).map(
        lambda t: json.dumps({**t[0], "sequenceNumber": t[1]})
    ),
    st.tuples(st.sampled_from(VALID), json_values).map(lambda t: json.dumps({**t[0], "event": t[1]})),
    raw_text,
    raw_bytes,
)
