"""Realtime client events for the fuzz tests: valid events (GA and beta session updates, audio,
items, responses) as they are, mutated, with lying base64 audio, and raw garbage.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from hypothesis import strategies as st

from omnivoice.audio.formats import PCM16

from .strategies import b64, lying_base64, mutated, pick, raw_bytes, raw_text

TONE = PCM16.encode(0.3 * np.sin(np.arange(4800) * 0.06))  # 0.2 s at 24 kHz
AUDIO = b64(TONE)
ITEM_ID = "item_fuzz"
GA_SESSION = {
    "type": "realtime",
    "instructions": "be brief",
    "output_modalities": ["audio"],
    "max_output_tokens": 40,
    "audio": {
        "input": {
            "format": {"type": "audio/pcm", "rate": 24000},
            "turn_detection": {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
                               "silence_duration_ms": 200, "create_response": True,
                               "interrupt_response": True, "idle_timeout_ms": 5000},
            "transcription": {"model": "whisper-1"},
        },
        "output": {"format": {"type": "audio/pcmu"}, "voice": "alloy", "speed": 1.0},
    },
    "omnivoice": {"min_output_tokens": 2, "output_audio_frames": 3},
}  # fmt: skip
BETA_SESSION = {
    "modalities": ["text", "audio"], "voice": "ethan", "input_audio_format": "g711_alaw",
    "output_audio_format": "pcm16", "turn_detection": {"type": "semantic_vad", "eagerness": "high"},
    "max_response_output_tokens": "inf", "temperature": 0.8, "tools": [], "tool_choice": "auto",
}  # fmt: skip
USER_ITEM = {
    "id": ITEM_ID, "type": "message", "role": "user",
    "content": [{"type": "input_text", "text": "hi"},
                {"type": "input_audio", "audio": AUDIO, "transcript": "hi"}],
}  # fmt: skip
ASSISTANT_ITEM = {
    "type": "message", "role": "assistant", "status": "completed",
    "content": [{"type": "output_text", "text": "hello"}, {"type": "audio", "transcript": "there"}],
}  # fmt: skip
RESPONSE = {
    "output_modalities": ["text"], "instructions": "x", "voice": "alloy", "conversation": "none",
    "audio": {"output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "ethan"}},
    "max_output_tokens": 5, "metadata": {"k": "v"}, "temperature": 0.7, "output_audio_format": "g711_ulaw",
}  # fmt: skip
VALID_EVENTS: list[dict[str, Any]] = [
    {"type": "session.update", "event_id": "ev_1", "session": GA_SESSION},
    {"type": "session.update", "session": BETA_SESSION},
    {"type": "input_audio_buffer.append", "audio": AUDIO},
    {"type": "input_audio_buffer.commit"},
    {"type": "input_audio_buffer.clear"},
    {"type": "conversation.item.create", "previous_item_id": "root", "item": USER_ITEM},
    {"type": "conversation.item.create", "item": ASSISTANT_ITEM},
    {"type": "conversation.item.retrieve", "item_id": ITEM_ID},
    {"type": "conversation.item.delete", "item_id": ITEM_ID},
    {"type": "conversation.item.truncate", "item_id": ITEM_ID, "content_index": 0, "audio_end_ms": 100},
    {"type": "response.create", "response": RESPONSE},
    {"type": "response.create"},
    {"type": "response.cancel", "response_id": "resp_x"},
    {"type": "output_audio_buffer.clear"},
]
# one client event: valid, mutated, with lying base64 audio, or raw garbage
audio_events = lying_base64().map(lambda a: json.dumps({"type": "input_audio_buffer.append", "audio": a}))
item_audio_events = lying_base64().map(
    lambda a: json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_audio", "audio": a}]}})
)  # fmt: skip
mutated_events = st.sampled_from(VALID_EVENTS).flatmap(mutated).map(json.dumps)
events = pick(
    st.sampled_from(VALID_EVENTS).map(json.dumps),
    mutated_events,
    mutated_events,
    mutated_events,
    audio_events,
    item_audio_events,
    raw_text,
    raw_bytes,
)
