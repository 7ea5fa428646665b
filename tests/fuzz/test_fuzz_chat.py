"""Fuzz `/v1/chat/completions` validation: `parse_chat_request` and `to_engine_messages` on valid bodies
with fields dropped, retyped, pushed to edge values or added, audio parts with lying WAVs and broken
base64, and arbitrary JSON. The contract: a request the engine can run, or an `APIError` with a 4xx
status (the OpenAI error shape), never another exception.
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import example, given

from omnivoice.server.chat.schema import parse_chat_request, to_engine_messages
from omnivoice.server.errors import APIError
from omnivoice.types import AudioPart, TextPart
from tests.support.fuzz_inputs.chat import bodies

MAX_AUDIO_SECONDS = 2.0


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
        messages = to_engine_messages(req, MAX_AUDIO_SECONDS, 4096 * 4096)
    except APIError as e:
        assert 400 <= e.status < 500 and e.message
        assert set(e.body()["error"]) == {"message", "type", "param", "code"}
        return
    _engine_can_run(req, messages)
