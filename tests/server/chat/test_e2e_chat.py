"""End to end: the real engine (tiny default model) behind a real server, driven by the `openai` SDK."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from pydantic import BaseModel, Field

pytest.importorskip(
    "omnivoice.engine.engine", reason="the engine (omnivoice.engine.engine) has not landed yet"
)

from omnivoice.audio import decode_wav
from omnivoice.config import Profile, parse_profile
from omnivoice.server import create_app
from tests.support.polling import until
from tests.support.serve import ServerThread, serve_thread

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
USER: list[Any] = [{"role": "user", "content": "hello there, tell me a story about the sea"}]
# The random-weight talker rarely emits its end code: cap the frames so each request stays short.
TALKER_FRAMES = 200
# Enough text that the thinker is still writing when the first audio chunk is out: 4 frames are
# ~64 talker + code-predictor steps, and the random thinker may stop early unless held by min_tokens.
THINKER_TOKENS = 200


def e2e_profile(tiny_checkpoint: Path) -> Profile:
    """`Profile()` with the session's tiny-model cache and a shorter talker cap."""
    data = Profile().model_dump()
    data["model"]["cache_dir"] = str(tiny_checkpoint.parent)
    data["stages"]["talker"]["sampling"]["max_tokens"] = TALKER_FRAMES
    data["stages"]["capacity"]["enabled"] = False  # a loaded machine's measure must not refuse these
    return parse_profile(data)


@pytest.fixture(scope="module")
def server(tiny_checkpoint: Path) -> Iterator[ServerThread]:
    with serve_thread(create_app(e2e_profile(tiny_checkpoint)), wait_healthy=300) as st:
        yield st


@pytest.fixture
def client(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def app_of(server: ServerThread) -> Any:
    return server.server.config.app


def test_streaming_audio_starts_before_the_text_ends(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="omnivoice", messages=USER, max_tokens=THINKER_TOKENS, stream=True,
        stream_options={"include_usage": True}, extra_body={"min_tokens": THINKER_TOKENS},
        modalities=["text", "audio"], audio={"voice": "ethan", "format": "pcm16"},
    )  # fmt: skip
    order, pcm, finish, usage = [], b"", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        if not chunk.choices:
            continue
        modality = chunk.model_extra["modality"]
        delta = chunk.choices[0].delta
        if modality == "audio":
            pcm += base64.b64decode(delta.audio.data)
            assert delta.content == delta.audio.data
            order.append("audio")
        elif delta.content:
            order.append("text")
        finish = chunk.choices[0].finish_reason or finish
    assert "text" in order and "audio" in order
    last_text = len(order) - 1 - order[::-1].index("text")
    first_audio = order.index("audio")
    assert first_audio < last_text, f"first audio at chunk {first_audio}, last text at {last_text}: {order}"
    assert finish in ("stop", "length")
    assert len(pcm) > 0 and len(pcm) % 2 == 0
    assert usage is not None and usage.completion_tokens == THINKER_TOKENS


def test_non_streaming_audio_is_a_decodable_wav(client: openai.OpenAI) -> None:
    done = client.chat.completions.create(
        model="omnivoice", messages=USER, max_tokens=12, modalities=["text", "audio"],
        audio={"voice": "ethan", "format": "wav"},
    )  # fmt: skip
    msg = done.choices[0].message
    assert isinstance(msg.content, str) and msg.content
    wav = base64.b64decode(msg.audio.data)
    pcm, rate = decode_wav(wav)
    assert rate == 24000 and pcm.size > 0 and np.abs(pcm).max() > 0
    data, sf_rate = sf.read(io.BytesIO(wav))
    assert sf_rate == 24000 and data.shape == pcm.shape
    assert msg.audio.transcript == msg.content
    assert done.choices[1].message.audio.data == msg.audio.data  # vLLM-Omni's audio choice
    assert done.usage.completion_tokens <= 12


async def test_concurrent_requests(server: ServerThread) -> None:
    client = openai.AsyncOpenAI(
        base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120
    )

    async def one(i: int) -> tuple[str, int]:
        stream = await client.chat.completions.create(
            model="omnivoice", messages=[{"role": "user", "content": f"request {i}: say something"}],
            max_tokens=10, stream=True, audio={"voice": "ethan", "format": "pcm16"},
        )  # fmt: skip
        text, audio = "", 0
        async for chunk in stream:
            if chunk.choices and chunk.model_extra["modality"] == "audio":
                audio += len(base64.b64decode(chunk.choices[0].delta.audio.data))
            elif chunk.choices:
                text += chunk.choices[0].delta.content or ""
        return text, audio

    results = await asyncio.gather(*(one(i) for i in range(4)))
    await client.close()
    assert all(text and audio > 0 for text, audio in results)


async def test_client_disconnect_mid_stream_aborts_in_the_engine(server: ServerThread) -> None:
    client = openai.AsyncOpenAI(
        base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120
    )
    stream = await client.chat.completions.create(
        model="omnivoice", messages=USER, max_tokens=200, stream=True, audio={"format": "pcm16"}
    )
    async for chunk in stream:
        if chunk.choices and chunk.model_extra["modality"] == "audio":
            break  # audio is flowing: every stage holds the request now
    await stream.close()
    await client.close()
    engine = app_of(server).state.lifecycle.engine

    def idle() -> bool:
        stats = engine.stats()
        stages_idle = all(s.running == 0 and s.queued == 0 for s in stats.stages)
        return stats.active_requests == 0 and stages_idle and app_of(server).state.admission.in_flight == 0

    await until(idle, 15, "the request aborted after the disconnect")
    assert app_of(server).state.admission.in_flight == 0


def test_bad_requests_are_openai_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="omnivoice", messages=USER, audio={"voice": "alloy", "format": "wav"}
        )
    assert e.value.param == "audio.voice" and "alloy" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="omnivoice", messages=[*USER, {"role": "tool", "content": "1", "tool_call_id": "t"}]
        )
    assert e.value.param == "messages[1].tool_call_id"  # a result answering no call
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    with pytest.raises(openai.BadRequestError, match="not a readable image/png image"):
        client.chat.completions.create(model="omnivoice", messages=[{"role": "user", "content": [image]}])
    with pytest.raises(openai.BadRequestError, match="n=1"):
        client.chat.completions.create(model="omnivoice", messages=USER, n=2)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=USER)


class Weather(BaseModel):
    """The answer `response_format` asks for: bounded, so even the random model's JSON ends."""

    city: str = Field(max_length=12)
    unit: Literal["celsius", "fahrenheit"]
    days: int = Field(ge=1, le=14)


def test_response_format_holds_the_random_model_to_the_schema(client: openai.OpenAI) -> None:
    # the SDK sends the model's strict JSON schema and parses the answer with it
    done = client.chat.completions.parse(
        model="omnivoice", messages=USER, modalities=["text"], max_tokens=THINKER_TOKENS,
        response_format=Weather, temperature=1.0, seed=5,
    )  # fmt: skip
    choice = done.choices[0]
    assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Weather)
    stream = client.chat.completions.create(
        model="omnivoice", messages=USER, modalities=["text"], max_tokens=THINKER_TOKENS, stream=True,
        response_format={"type": "json_object"}, temperature=1.0, seed=6,
    )  # fmt: skip
    chunks = [c.choices[0] for c in stream if c.choices]
    assert chunks[-1].finish_reason == "stop"
    assert isinstance(json.loads("".join(c.delta.content or "" for c in chunks)), dict)
    with pytest.raises(openai.BadRequestError) as e:
        bad = {"name": "weather", "schema": {"type": "object", "properties": {"city": {"type": "town"}}}}
        client.chat.completions.create(
            model="omnivoice", messages=USER, response_format={"type": "json_schema", "json_schema": bad}
        )
    assert e.value.param == "response_format" and "town" in e.value.message


def test_cli_serve(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """`omnivoice serve` loads the engine, logs its URL once ready, serves, and shuts down on SIGINT."""
    profile = tmp_path / "profile.yaml"
    profile.write_text(f"model:\n  cache_dir: {tiny_checkpoint.parent}\n")
    cmd = [sys.executable, "-m", "omnivoice", "serve", "--profile", str(profile), "--port", "0"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True, env={**os.environ})
    try:
        url = None
        deadline = time.monotonic() + 300
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            line = proc.stderr.readline()
            m = re.search(r"omnivoice serving omnivoice on (http://127\.0\.0\.1:\d+)", line)
            url = m.group(1) if m else None
        assert url, f"no 'serving' line; exit code {proc.poll()}"
        assert httpx.get(f"{url}/health").json() == {"status": "ok"}
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "omnivoice"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) in (0, 130)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
