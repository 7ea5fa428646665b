"""An answer's audio is bounded by the text it speaks (`stages.talker.frames_per_text_token`): the
random-weight tiny talker never samples its end code, as a real talker caught in a loop would not, so
without the bound it would talk until the talker's hard cap. Over a real server and the tiny model."""

from __future__ import annotations

import base64
import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from omnivoice.config import TalkerStage
from tests.support.realtime_client import text_turn
from tests.support.serve import ServerThread, serve_tiny

pytestmark = pytest.mark.slow

HARD_CAP = 300  # talker frames: what the old, unbounded talker ran to (24 s of audio)
# With this seed and temperature the tiny thinker samples its end token after a few tokens (a "stop"
# of its own); if the tiny recipe changes, find another with a few requests over seeds.
STOPPING_SEED = 112
BYTES_PER_FRAME = 2 * 1920  # pcm16 at 24 kHz, 80 ms per codec frame


@pytest.fixture(scope="module")
def server(tiny_checkpoint: Path) -> Iterator[ServerThread]:
    stage = {"worker": "thread", "max_seq_len": 1024, "max_batch": 4}
    stages = {
        "thinker": stage,
        "talker": {**stage, "sampling": {"max_tokens": HARD_CAP}},
        "code2wav": stage,
    }
    with serve_tiny(tiny_checkpoint, stages=stages, realtime={"max_audio_ahead_ms": 600_000}) as st:
        yield st


def bound(text_tokens: int) -> int:
    """The most frames the default bound allows for an answer of `text_tokens` (its last one is never
    spoken: the talker is handed every token but the final one)."""
    d = TalkerStage()
    assert d.frames_per_text_token is not None
    return math.ceil(d.frames_per_text_token * (text_tokens - 1)) + d.extra_frames


def test_a_chat_answer_cut_by_its_text_ends_with_length(server: ServerThread) -> None:
    body = {
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 40, "temperature": 1.0, "seed": STOPPING_SEED,
    }  # fmt: skip
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    usage, choice = r.json()["usage"], r.json()["choices"][0]
    tokens, frames = usage["completion_tokens"], usage["completion_tokens_details"]["audio_tokens"]
    assert tokens < 40, "the seed no longer makes the tiny thinker stop by itself: pick another"
    assert 0 < frames <= bound(tokens) < HARD_CAP - 1, (tokens, frames)
    # the thinker stopped by itself, the audio was cut: a length limit, as OpenAI reports one
    assert choice["finish_reason"] == "length"
    assert len(base64.b64decode(choice["message"]["audio"]["data"])) <= 44 + frames * BYTES_PER_FRAME


async def test_a_realtime_answer_is_bounded_by_its_text(server: ServerThread) -> None:
    url = server.base_url.replace("http", "ws") + "/v1/realtime"
    audio, response = await text_turn(url, {"max_output_tokens": 8})
    assert response["status"] == "incomplete"
    assert response["status_details"]["reason"] == "max_output_tokens"
    frames = response["usage"]["output_token_details"]["audio_tokens"]
    assert 0 < frames <= bound(8) < HARD_CAP - 1, frames
    assert audio <= frames * BYTES_PER_FRAME
