"""Chat completion bodies for the fuzz tests: valid bodies (every field, text and audio parts) with
fields dropped, retyped, pushed to edge values or added; audio parts with lying WAVs and broken base64;
and arbitrary JSON.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from omnivoice.audio import encode_wav

from .strategies import b64, json_values, lying_base64, mutated, pick
from .wav import wav_files

WAV = b64(encode_wav(0.3 * np.sin(np.arange(1600) * 0.05), 16000))
VALID_BODIES = [
    {"messages": [{"role": "user", "content": "hi"}]},
    {
        "model": "omnivoice",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "developer", "content": [{"type": "text", "text": "really"}]},
            {"role": "user", "content": [
                {"type": "text", "text": "what is said here?"},
                {"type": "input_audio", "input_audio": {"data": WAV, "format": "wav"}},
                {"type": "audio_url", "audio_url": {"url": f"data:audio/wav;base64,{WAV}"}},
            ]},
            {"role": "assistant", "content": "a greeting"},
            {"role": "user", "content": [
                {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "pcm16"}}]},
        ],
        "modalities": ["text", "audio"],
        "audio": {"voice": "ethan", "format": "wav"},
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 20,
        "max_completion_tokens": 10,
        "temperature": 0.7,
        "top_p": 0.9,
        "seed": 42,
        "n": 1,
        "min_tokens": 2,
        "ignore_eos": False,
        "min_audio_frames": 1,
        "max_audio_frames": 5,
        "user": "u1",
    },
]  # fmt: skip

audio_part_bodies = st.tuples(lying_base64(wav_files()), st.sampled_from(["wav", "pcm16", "mp3"])).map(
    lambda t: {"messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": t[0], "format": t[1]}}]}]}
)  # fmt: skip
audio_url_bodies = st.tuples(
    st.sampled_from(
        ["data:audio/wav;base64,", "data:audio/mpeg;base64,", "data:audio/wav,", "http://x/a.wav#"]
    ),
    lying_base64(wav_files()),
).map(
    lambda t: {
        "messages": [{"role": "user", "content": [{"type": "audio_url", "audio_url": {"url": t[0] + t[1]}}]}]
    }
)
bodies = pick(
    st.sampled_from(VALID_BODIES).flatmap(mutated),
    st.sampled_from(VALID_BODIES).flatmap(mutated),
    st.sampled_from(VALID_BODIES).flatmap(mutated),
    audio_part_bodies,
    audio_url_bodies,
    st.dictionaries(st.sampled_from(["messages", "model", "seed", "stream", "audio", "n"]), json_values),
)
