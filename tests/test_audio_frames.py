"""N audio frames mean N frames of audio (80 ms each) wherever a request sets them: chat's
`max_audio_frames`, realtime's `omnivoice.output_audio_frames`. Over a real server and the tiny model,
whose random-weight talker never samples its end code, so the frame limit is what ends its audio."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from omnivoice.audio import decode_wav
from tests.support.realtime_client import text_turn
from tests.support.serve import ServerThread, serve_tiny

pytestmark = pytest.mark.slow

FRAMES = 12
SAMPLES_PER_FRAME = 1920  # 80 ms at 24 kHz
TEXT_TOKENS = 8  # enough text that its bound on the audio (frames_per_text_token) is far above FRAMES


@pytest.fixture(scope="module")
def server(tiny_checkpoint: Path) -> Iterator[ServerThread]:
    with serve_tiny(tiny_checkpoint) as st:
        yield st


def _n_frames_of_audio(frames: int, samples: int) -> None:
    """`frames` reported, and the samples of that many frames: a decode of N frames holds back part
    of the last one's (the vocoder's causal tail), so more than N - 1 frames' and at most N frames'."""
    assert frames == FRAMES
    assert (FRAMES - 1) * SAMPLES_PER_FRAME < samples <= FRAMES * SAMPLES_PER_FRAME, samples


def test_a_chat_request_gets_max_audio_frames_frames(server: ServerThread) -> None:
    body = {
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": TEXT_TOKENS, "min_tokens": TEXT_TOKENS, "max_audio_frames": FRAMES,
    }  # fmt: skip
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    choice, usage = r.json()["choices"][0], r.json()["usage"]
    pcm, rate = decode_wav(base64.b64decode(choice["message"]["audio"]["data"]))
    assert rate == 24000
    _n_frames_of_audio(usage["completion_tokens_details"]["audio_tokens"], pcm.size)
    assert choice["finish_reason"] == "length"  # the audio was cut at its limit


async def test_a_realtime_response_gets_output_audio_frames_frames(server: ServerThread) -> None:
    url = server.base_url.replace("http", "ws") + "/v1/realtime"
    session = {
        "max_output_tokens": TEXT_TOKENS,
        "omnivoice": {"min_output_tokens": TEXT_TOKENS, "output_audio_frames": FRAMES},
    }
    audio, response = await text_turn(url, session)
    frames = response["usage"]["output_token_details"]["audio_tokens"]
    _n_frames_of_audio(frames, audio // 2)  # pcm16 at 24 kHz, the session's default output format
