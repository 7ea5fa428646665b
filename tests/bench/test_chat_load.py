"""The load generator against a fake server on loopback that streams a scripted response."""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from omnivoice.bench import cli
from omnivoice.bench.chat_load import LoadConfig, _StreamState, audio_seconds, run_load, wav_seconds
from omnivoice.bench.metrics import RequestRecord, summarize
from tests.support.serve import serve_thread

RATE = 24000


def pcm(seconds: float) -> bytes:
    return b"\x01\x00" * round(seconds * RATE)


def wav(seconds: float, data_size: int | None = None) -> bytes:
    body = pcm(seconds)
    size = len(body) if data_size is None else data_size
    head = (b"RIFF", 36 + len(body), b"WAVE", b"fmt ", 16, 1, 1, RATE, RATE * 2, 2, 16, b"data", size)
    return struct.pack("<4sI4s4sIHHIIHH4sI", *head) + body


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# (offset from request arrival in s, modality, delta); first text at 0.05, first audio (0.32 s) at 0.15,
# then 1 s of audio as a WAV at 0.75: the player waits 0.75 - (0.15 + 0.32) = 0.28 s.
SCRIPT = [
    (0.00, "text", {"role": "assistant", "content": ""}),
    (0.05, "text", {"content": "Hello"}),
    (0.10, "text", {"content": " world"}),
    (0.15, "audio", {"content": b64(pcm(0.32)), "audio": {"data": b64(pcm(0.32))}}),
    (0.20, "text", {"content": "!"}),
    (0.75, "audio", {"content": b64(wav(1.0))}),
]
END = 0.80


class FakeOmni:
    """Starlette app speaking the streamed chat-completions audio protocol with known timings."""

    def __init__(self) -> None:
        self.url = ""  # set once the server listens
        self.payloads: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.app = Starlette(
            routes=[
                Route("/v1/models", self.models),
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
            ]
        )

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "tiny-omni", "owned_by": "fake-omni"}]})

    async def chat(self, request: Request) -> Response:
        payload = await request.json()
        self.payloads.append(payload)
        prompt = payload["messages"][-1]["content"]
        if "fail" in prompt:
            return JSONResponse({"error": {"message": "boom"}}, status_code=500)
        return StreamingResponse(self._stream(payload, prompt), media_type="text/event-stream")

    async def _stream(self, payload: dict, prompt: str):
        loop = asyncio.get_running_loop()
        start = loop.time()
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            for offset, modality, delta in SCRIPT:
                await asyncio.sleep(max(0.0, start + offset - loop.time()))
                yield sse({"id": "c1", "modality": modality, "choices": [{"index": 0, "delta": delta}]})
                if "garbled" in prompt:
                    yield "data: {not json\n\n"
            await asyncio.sleep(max(0.0, start + END - loop.time()))
            yield sse({"modality": "text", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
            if payload.get("stream_options", {}).get("include_usage"):
                yield sse({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 7}})
            yield "data: [DONE]\n\n"
        finally:
            self.in_flight -= 1


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOmni]:
    fake = FakeOmni()
    config = uvicorn.Config(fake.app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    with serve_thread(fake.app, wait_healthy=None, config=config) as st:
        fake.url = st.base_url
        yield fake


@pytest.fixture
def fake(server: FakeOmni) -> FakeOmni:
    server.payloads.clear()
    server.max_in_flight = 0
    return server


def test_usage_counts_are_read_from_whichever_chunk_has_them() -> None:
    """A server that sends the prompt's length apart from the completion's count has both recorded."""
    state = _StreamState(RequestRecord(t0=0.0))
    state.feed({"choices": [], "usage": {"prompt_tokens": 14}}, 0.1)
    assert state.prompt_tokens == 14 and state.usage_tokens is None
    state.feed({"choices": [], "usage": {"completion_tokens": 64}}, 0.2)
    assert (state.prompt_tokens, state.usage_tokens) == (14, 64)


def test_audio_seconds_of_pcm_and_wav() -> None:
    assert audio_seconds(pcm(0.5)) == pytest.approx(0.5)
    assert audio_seconds(wav(0.25)) == pytest.approx(0.25)
    # streamed WAV headers often leave the data size open
    assert wav_seconds(wav(0.25, data_size=0xFFFFFFFF)) == pytest.approx(0.25)
    assert wav_seconds(wav(0.25, data_size=0)) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        wav_seconds(b"RIFF\x00\x00\x00\x00WAVEjunk")


async def test_one_request_timings_match_the_script(fake: FakeOmni) -> None:
    cfg = LoadConfig(base_url=fake.url, prompts=("hi",), num_prompts=1, max_tokens=32, seed=3)
    result = await run_load(cfg)
    assert result.model == "tiny-omni" and result.owned_by == "fake-omni"
    sent = fake.payloads[0]
    assert sent["model"] == "tiny-omni" and sent["stream"] is True and sent["seed"] == 3
    assert sent["modalities"] == ["text", "audio"]
    assert sent["audio"] == {"voice": "ethan", "format": "pcm16"}
    assert sent["stream_options"] == {"include_usage": True}
    assert sent["max_tokens"] == 32

    (r,) = result.records
    assert r.error is None and r.first_text is not None and r.first_audio is not None
    # times are measured from before the request is sent, so they are never below the script's
    assert 0.045 <= r.first_text - r.t0 < 0.05 + 0.15  # the empty role chunk is not the first text
    assert 0.145 <= r.first_audio - r.t0 < 0.15 + 0.15
    assert r.audio_seconds == pytest.approx(1.32)  # the first chunk counted once, not twice
    assert r.text_tokens == 7 and r.prompt_tokens == 5  # from the usage chunk
    s = summarize(result.records, result.duration_s)
    assert s.rtf.mean == pytest.approx(0.75 / 1.32, abs=0.1)
    assert s.max_stall_ms == pytest.approx(280.0, abs=100.0)
    assert s.ttfp_ms.p99 == pytest.approx(1000 * (r.first_audio - r.t0))


async def test_text_chunks_count_as_tokens_without_usage(fake: FakeOmni) -> None:
    cfg = LoadConfig(base_url=fake.url, prompts=("hi",), num_prompts=1, include_usage=False, model="x")
    (r,) = (await run_load(cfg)).records
    assert "stream_options" not in fake.payloads[0]
    assert fake.payloads[0]["model"] == "x"
    assert r.text_tokens == 3 and r.prompt_tokens is None
    assert summarize([r], 1.0).prompt_tokens.mean is None


async def test_errors_are_counted_not_fatal(fake: FakeOmni) -> None:
    cfg = LoadConfig(base_url=fake.url, prompts=("ok", "fail", "garbled"), num_prompts=3, concurrency=3)
    result = await run_load(cfg)
    errors = sorted(r.error or "" for r in result.records)
    assert errors[0] == ""
    assert any(e.startswith("RuntimeError: HTTP 500") for e in errors)
    assert any("JSONDecodeError" in e for e in errors)
    s = summarize(result.records, result.duration_s)
    assert (s.requests, s.errors) == (1, 2)


def test_cli_closed_loop_with_warmups(fake: FakeOmni, tmp_path: Path, capsys) -> None:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    out = tmp_path / "res" / "run.json"
    args = parser.parse_args(
        ["--base-url", fake.url, "--num-prompts", "4", "--concurrency", "2", "--warmups", "1",
         "--output-json", str(out), "--label", "test", "--machine", "loopback"]
    )  # fmt: skip
    assert cli.run(args) == 0
    assert len(fake.payloads) == 5  # one warm-up + four measured
    assert fake.max_in_flight == 2

    report = json.loads(out.read_text())
    assert report["requests"] == 4 and report["errors"] == 0
    assert report["concurrency"] == 2 and report["mean_prompt_tokens"] == 5
    assert (report["engine"], report["machine"], report["label"]) == ("fake-omni", "loopback", "test")
    assert report["audio_seconds"] == pytest.approx(4 * 1.32)
    # two rounds of ~0.8 s each
    assert report["duration_s"] >= 1.6  # the fake's pacing; a busy machine only adds to it
    assert report["audio_s_per_s"] == pytest.approx(4 * 1.32 / report["duration_s"], rel=0.01)
    assert report["output_tok_per_s"] == pytest.approx(28 / report["duration_s"], rel=0.01)
    assert report["max_stall_ms"] >= 180.0  # the fake's 280 ms gap, less timer slack
    for key in ("mean_ttft_ms", "p50_ttft_ms", "p99_ttft_ms", "mean_ttfp_ms", "p50_ttfp_ms", "p99_ttfp_ms",
                "mean_rtf", "p50_rtf", "p99_rtf", "command", "timestamp"):  # fmt: skip
        assert report[key] is not None, key

    captured = capsys.readouterr()
    assert captured.err.count("[request ") == 4 and captured.err.count("[warm-up ") == 1
    assert "TTFP (ms)" in captured.out


def test_cli_reports_an_unreachable_server(capsys) -> None:
    with socket.socket() as s:  # a port that nothing listens on once the socket is closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--base-url", f"http://127.0.0.1:{port}", "--num-prompts", "1"])
    assert cli.run(args) == 1
    assert "cannot start" in capsys.readouterr().err


def test_cli_sends_spoken_input_as_an_input_audio_part(fake: FakeOmni, tmp_path: Path, capsys) -> None:
    clip = tmp_path / "question.wav"
    clip.write_bytes(wav(0.5))
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(
        ["--base-url", fake.url, "--num-prompts", "1", "--warmups", "0", "--input-audio", str(clip),
         "--prompt", "Answer me.", "--quiet"]
    )  # fmt: skip
    assert cli.run(args) == 0
    (content,) = [p["messages"][-1]["content"] for p in fake.payloads]
    audio, text = content
    assert audio == {"type": "input_audio", "input_audio": {"data": b64(wav(0.5)), "format": "wav"}}
    assert text == {"type": "text", "text": "Answer me."}

    not_wav = tmp_path / "notes.txt"
    not_wav.write_text("hello")
    args = parser.parse_args(["--base-url", fake.url, "--input-audio", str(not_wav)])
    assert cli.run(args) != 0
    assert "not a WAV file" in capsys.readouterr().err
