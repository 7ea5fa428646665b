"""A streamed audio chunk is built around its base64 rather than JSON-encoded: it must still be the
chunk of chat/format.py's docstring, byte for byte valid JSON on one SSE line."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from omnivoice.audio import decode_wav
from omnivoice.server.chat.format import ChunkWriter, Turn, audio_b64

TURN = Turn(
    id="chatcmpl-abc123",
    created=1733300000,
    model='tiny "omni" ü',
    want_text=True,
    want_audio=True,
    audio_format="wav",
    include_usage=False,
)


def _parse(event: bytes) -> dict:
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    assert event.count(b"\n") == 2  # one line: a raw newline would end the event early
    return json.loads(event[len(b"data: ") : -2])


def test_the_first_audio_chunk_carries_the_role_and_both_copies_of_the_audio() -> None:
    pcm = np.linspace(-0.5, 0.5, 2400, dtype=np.float32)
    b64 = audio_b64(pcm, 24000, "wav")
    said = 'He said "hi"\nthen ü'
    chunk = _parse(ChunkWriter(TURN).audio_event(b64, said))
    assert chunk == {
        "id": TURN.id,
        "object": "chat.completion.chunk",
        "created": TURN.created,
        "model": TURN.model,
        "modality": "audio",
        "choices": [
            {
                "index": 0,
                "delta": {
                    "role": "assistant",
                    "content": b64.decode(),
                    "audio": {"id": "audio-abc123", "data": b64.decode(), "transcript": said},
                },
                "logprobs": None,
                "finish_reason": None,
            }
        ],
    }
    decoded, rate = decode_wav(base64.b64decode(chunk["choices"][0]["delta"]["audio"]["data"]))
    assert rate == 24000 and decoded.size == pcm.size


@pytest.mark.parametrize("transcript", [None, ""])
def test_later_chunks_have_no_role_and_no_empty_transcript(transcript: str | None) -> None:
    writer = ChunkWriter(TURN)
    writer.text("Hello")  # the role went with this chunk
    delta = _parse(writer.audio_event(b"AAAA", transcript))["choices"][0]["delta"]
    assert delta == {"content": "AAAA", "audio": {"id": "audio-abc123", "data": "AAAA"}}
