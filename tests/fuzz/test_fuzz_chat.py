"""Fuzz `/v1/chat/completions` validation: `parse_chat_request` and `to_engine_messages` on valid bodies
with fields dropped, retyped, pushed to edge values or added, audio parts with lying WAVs and broken
base64, and arbitrary JSON. The contract: a request the engine can run, or an `APIError` with a 4xx
status (the OpenAI error shape), never another exception.
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from omnivoice.audio import encode_wav
from omnivoice.server.chat.schema import parse_chat_request, to_engine_messages
from omnivoice.server.errors import APIError
from omnivoice.types import AudioPart, TextPart

from .strategies import b64, json_values, lying_base64, mutated, pick
from .test_fuzz_wav import wav_files

WAV = b64(encode_wav(0.3 * np.sin(np.arange(1600) * 0.05), 16000))
MAX_AUDIO_SECONDS = 2.0
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


def _engine_can_run(req: object, messages: tuple) -> None:
    """What an accepted request hands the engine is within what the engine takes."""
    seed = req.seed  # type: ignore[attr-defined]
    if seed is not None:
        torch.Generator().manual_seed(seed + 10_000)  # the code predictor seeds with seed + frame
    for m in messages:
        assert m.role in ("system", "user", "assistant") and m.parts
        for part in m.parts:
            assert isinstance(part, TextPart | AudioPart)
            if isinstance(part, AudioPart):
                assert part.pcm.dtype == np.float32 and part.pcm.size > 0 and np.isfinite(part.pcm).all()
                assert part.pcm.size / part.sample_rate <= MAX_AUDIO_SECONDS


@given(bodies)
@example({"messages": [{"role": "user", "content": "hi"}], "seed": 2**64})  # past torch's seed range
@example({"messages": [{"role": "user", "content": "hi"}], "seed": -(2**63) - 1})
@example({"messages": [{"role": "user", "content": "hi"}], "temperature": float("nan")})
@example({"messages": [{"role": "user", "content": [5]}]})
@example({"messages": [{"role": "user", "content": [{"type": ["text"], "text": "hi"}]}]})  # unhashable type
@example(
    {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "\ud800"}}]}]}
)
def test_a_body_is_a_request_or_a_400(body: object) -> None:
    try:
        req = parse_chat_request(body)  # type: ignore[arg-type]
        messages = to_engine_messages(req, MAX_AUDIO_SECONDS)
    except APIError as e:
        assert 400 <= e.status < 500 and e.message
        assert set(e.body()["error"]) == {"message", "type", "param", "code"}
        return
    _engine_can_run(req, messages)
