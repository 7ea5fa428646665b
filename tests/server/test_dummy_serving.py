"""A `dummy:` model behind the real server: chat and realtime turns with spoken input, through its tokenizer.

The dummy is the shrunk build (`REDUCED`: the real vocabulary, ids and code groups, small layers) so the
CPU can run it; the full-size one differs only in its widths and depths.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from omnivoice.audio import encode_wav
from omnivoice.config import Profile, parse_profile
from omnivoice.engine.engine import Engine
from omnivoice.models.dummy import REDUCED, DummySource
from omnivoice.server import create_app
from tests.support.realtime_client import Recorder, send_audio
from tests.support.serve import ServerThread, serve_thread
from tests.support.speech import pcm16

pytestmark = pytest.mark.slow

SOURCE = DummySource("qwen3-omni-30b-a3b", overrides=REDUCED)
STAGE = {"worker": "thread", "max_seq_len": 512, "max_batch": 2}
TALKER_FRAMES = 6


def _tone(seconds: float, rate: int) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.2 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def _profile(cache_dir: Path) -> Profile:
    talker = {**STAGE, "sampling": {"max_tokens": TALKER_FRAMES}}
    stages = {"thinker": STAGE, "talker": talker, "code2wav": STAGE}
    return parse_profile({"model": {"cache_dir": str(cache_dir)}, "stages": stages})


async def _start_dummy(profile: Profile) -> Engine:
    return await Engine.start(profile, source=SOURCE)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    app = create_app(_profile(tmp_path_factory.mktemp("omnivoice-cache")), _start_dummy)
    with serve_thread(app, wait_healthy=300) as st:
        yield st


def test_chat_with_spoken_input_answers_text_and_audio(server: ServerThread) -> None:
    wav = base64.b64encode(encode_wav(_tone(1.0, 16000), 16000)).decode()
    content = [
        {"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}},
        {"type": "text", "text": "What did I just say?"},
    ]
    body = {
        "model": "omnivoice", "messages": [{"role": "user", "content": content}],
        "max_tokens": 5, "min_tokens": 5, "modalities": ["text", "audio"],
        "audio": {"voice": "ethan", "format": "wav"},
    }  # fmt: skip
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    done = r.json()
    message = done["choices"][0]["message"]
    assert isinstance(message["content"], str) and message["content"].strip()  # decoded by the tokenizer
    assert done["usage"]["completion_tokens"] == 5
    # the chat layout (im_start, role, newline...) plus the audio's placeholders: 1 s is 13 tokens
    assert done["usage"]["prompt_tokens"] >= 13 + 10
    assert len(base64.b64decode(message["audio"]["data"])) > 44  # a WAV with samples after its header


async def test_realtime_spoken_turn_gets_a_transcript(server: ServerThread) -> None:
    client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    async with client.realtime.connect(model="omnivoice") as conn:
        rec = Recorder(conn)
        await rec.next("session.created")
        session = {
            "type": "realtime", "max_output_tokens": 4, "audio": {"input": {"turn_detection": None}},
            "omnivoice": {"min_output_tokens": 4, "output_audio_frames": TALKER_FRAMES},
        }  # fmt: skip
        await conn.session.update(session=session)  # type: ignore[arg-type]
        await send_audio(conn, pcm16(_tone(1.0, 24000)))
        await conn.input_audio_buffer.commit()
        await rec.next("input_audio_buffer.committed")
        await conn.response.create()
        done = await rec.next("response.done", timeout=120)
        await rec.close()
    assert done.response.status == "incomplete", done.response  # held to max_output_tokens
    assert done.response.output[0].content[0].transcript.strip()
    assert done.response.usage.output_tokens == 4 and done.response.usage.input_tokens > 13
    assert rec.audio()
