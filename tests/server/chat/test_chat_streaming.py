"""Streaming (SSE) responses, disconnects, admission and lifecycle, over a real server and the fake engine."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from omnivoice.audio import decode_wav
from tests.support.fake_engine import SAMPLE_RATE, FakeServer, Script, serve_fake
from tests.support.polling import until, wait_until

USER: list[Any] = [{"role": "user", "content": "hi"}]
SCRIPT = Script()
FULL_TEXT = "".join(SCRIPT.texts)


@pytest.fixture(scope="module")
def srv() -> Iterator[FakeServer]:
    with serve_fake() as s:
        yield s


async def stream_events(url: str, **body: object) -> list[bytes]:
    """POST a streaming request; return the raw SSE events (without the trailing blank line)."""
    body = {"stream": True, **body}
    async with (
        httpx.AsyncClient(base_url=url, timeout=10) as c,
        c.stream("POST", "/v1/chat/completions", json=body) as r,
    ):
        assert r.status_code == 200, await r.aread()
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = await r.aread()
    assert raw.endswith(b"\n\n")
    return raw[:-2].split(b"\n\n")


def parse(events: list[bytes]) -> list[dict]:
    """Check SSE framing (`data: ` JSON events, `[DONE]` last) and return the JSON payloads."""
    assert events[-1] == b"data: [DONE]"
    out = []
    for e in events[:-1]:
        assert e.startswith(b"data: ") and b"\n" not in e
        out.append(json.loads(e[len(b"data: ") :]))
    return out


async def test_text_and_audio_stream_shapes(srv: FakeServer) -> None:
    chunks = parse(await stream_events(srv.url, messages=USER, stream_options={"include_usage": True}))
    assert {c["id"] for c in chunks} == {chunks[0]["id"]} and chunks[0]["id"].startswith("chatcmpl-")
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "omnivoice" for c in chunks)
    assert all(c["modality"] in ("text", "audio") for c in chunks)
    *body, end, usage = chunks
    assert body[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all("role" not in c["choices"][0]["delta"] for c in body[1:])
    text = [c["choices"][0]["delta"]["content"] for c in body if c["modality"] == "text"]
    assert "".join(text) == FULL_TEXT
    audio = [c["choices"][0]["delta"] for c in body if c["modality"] == "audio"]
    assert len(audio) == SCRIPT.audio_chunks
    for delta in audio:  # default format wav: one complete WAV per chunk, in both places
        assert delta["content"] == delta["audio"]["data"]
        pcm, rate = decode_wav(base64.b64decode(delta["content"]))
        assert rate == SAMPLE_RATE and pcm.size == SCRIPT.chunk_samples
    assert [c["modality"] for c in body[:2]] == ["text", "audio"]  # interleaved as the engine yields
    assert end["choices"][0]["finish_reason"] == "stop"
    # OpenAI's shape: the spoken text rides on the audio chunks (and the end chunk) too
    spoken = [c["choices"][0]["delta"].get("audio", {}).get("transcript", "") for c in [*body, end]]
    assert "".join(spoken) == FULL_TEXT
    ids = {
        c["choices"][0]["delta"]["audio"]["id"] for c in [*body, end] if "audio" in c["choices"][0]["delta"]
    }
    assert ids == {"audio-" + chunks[0]["id"].removeprefix("chatcmpl-")}
    assert all(c["choices"][0]["finish_reason"] is None for c in body)
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == len(SCRIPT.texts)
    assert usage["usage"]["total_tokens"] == usage["usage"]["prompt_tokens"] + len(SCRIPT.texts)
    assert usage["usage"]["completion_tokens_details"]["audio_tokens"] == 2 * SCRIPT.audio_chunks


async def test_pcm16_audio_and_no_usage_chunk_by_default(srv: FakeServer) -> None:
    chunks = parse(await stream_events(srv.url, messages=USER, audio={"voice": "chelsie", "format": "pcm16"}))
    assert "usage" not in chunks[-1] and chunks[-1]["choices"][0]["finish_reason"] == "stop"
    audio = [c["choices"][0]["delta"]["audio"]["data"] for c in chunks if c["modality"] == "audio"]
    assert [len(base64.b64decode(a)) for a in audio] == [2 * SCRIPT.chunk_samples] * SCRIPT.audio_chunks
    assert srv.engine.requests[-1].voice == "chelsie"


async def test_text_only(srv: FakeServer) -> None:
    chunks = parse(await stream_events(srv.url, messages=USER, modalities=["text"]))
    assert {c["modality"] for c in chunks} == {"text"}
    assert srv.engine.requests[-1].want_audio is False


async def test_audio_only_carries_the_transcript(srv: FakeServer) -> None:
    chunks = parse(await stream_events(srv.url, messages=USER, modalities=["audio"]))
    assert {c["modality"] for c in chunks[:-1]} == {"audio"}
    parts = [c["choices"][0]["delta"]["audio"].get("transcript", "") for c in chunks]
    assert "".join(parts) == FULL_TEXT


async def test_each_chunk_is_sent_when_the_engine_yields_it() -> None:
    with serve_fake(Script(texts=("a", "b", "c", "d"), audio_chunks=0, delay=0.25)) as s:
        arrivals = []
        async with httpx.AsyncClient(base_url=s.url, timeout=10) as c:
            t0 = time.perf_counter()
            body = {"messages": USER, "stream": True}
            async with c.stream("POST", "/v1/chat/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        arrivals.append(time.perf_counter() - t0)
    assert len(arrivals) == 5  # four texts + the end chunk
    # The engine yields every 0.25 s: buffered output would arrive in one burst at >= 1 s.
    assert arrivals[0] < 0.6 and arrivals[3] - arrivals[0] > 0.5, arrivals


async def test_engine_exception_mid_stream_becomes_an_error_event() -> None:
    with serve_fake(Script(raise_after=2)) as s:
        chunks = parse(await stream_events(s.url, messages=USER))
        assert chunks[-1]["error"]["type"] == "server_error"
        assert len(chunks) == 3  # two outputs, then the error
        assert s.count("error") == 1


async def test_engine_error_finish_becomes_an_error_event() -> None:
    with serve_fake(Script(finish_reason="error")) as s:
        chunks = parse(await stream_events(s.url, messages=USER))
        assert chunks[-1] == {
            "error": {"message": "boom", "type": "server_error", "param": None, "code": None}
        }


async def test_a_request_failed_by_the_engine_stopping_is_unavailable_not_an_internal_error() -> None:
    # the engine's stages stop (a dead worker, a device fault) while requests are in flight: each ends
    # with the engine's error and the server answers 503 (retry), over SSE and as a plain response
    with serve_fake(Script(texts=("x",) * 40, audio_chunks=0, delay=0.05, finish_reason="error")) as s:
        async with httpx.AsyncClient(base_url=s.url, timeout=30) as c:
            plain = asyncio.create_task(c.post("/v1/chat/completions", json={"messages": USER}))
            body = {"messages": USER, "stream": True}
            async with c.stream("POST", "/v1/chat/completions", json=body) as r:
                lines = r.aiter_lines()
                await anext(lines)  # streaming: its headers (200) are sent
                s.engine.failure = "the engine stopped unexpectedly; it is restarting, retry shortly"
                rest = [line async for line in lines]
            answered = await plain
    chunks = [json.loads(x.removeprefix("data: ")) for x in rest if x.startswith("data: {")]
    assert chunks[-1]["error"]["code"] == "service_unavailable"
    assert chunks[-1]["error"]["message"] == "boom"  # the engine's own words for the request
    assert answered.status_code == 503 and answered.json()["error"]["code"] == "service_unavailable"


async def test_client_disconnect_mid_stream_aborts_the_request() -> None:
    with serve_fake(Script(texts=("x",) * 400, audio_chunks=0, delay=0.02)) as s:
        async with httpx.AsyncClient(base_url=s.url, timeout=10) as c:
            body = {"messages": USER, "stream": True}
            async with c.stream("POST", "/v1/chat/completions", json=body) as r:
                lines = r.aiter_lines()
                first = json.loads((await anext(lines)).removeprefix("data: "))
        rid = first["id"]
        await until(lambda: rid in s.engine.aborted, 5)
        assert s.engine.running == set()
        await until(lambda: s.count("cancelled") == 1 and s.app.state.admission.in_flight == 0, 5)
        assert s.engine.aborted == [rid]


async def test_client_disconnect_during_non_streaming_request_aborts_it() -> None:
    with serve_fake(Script(texts=("x",) * 400, audio_chunks=0, delay=0.02)) as s:
        async with httpx.AsyncClient(base_url=s.url, timeout=0.3) as c:
            with pytest.raises(httpx.ReadTimeout):
                await c.post("/v1/chat/completions", json={"messages": USER})
        await until(lambda: len(s.engine.aborted) == 1, 5)
        assert s.engine.aborted[0] == s.engine.requests[0].request_id
        await until(lambda: s.count("cancelled") == 1 and s.app.state.admission.in_flight == 0, 5)


async def test_over_the_concurrency_limit_is_503_at_once() -> None:
    slow = Script(texts=("x",) * 100, audio_chunks=0, delay=0.06)  # 6 s
    with serve_fake(slow, server={"max_concurrent_requests": 1}) as s:
        async with httpx.AsyncClient(base_url=s.url, timeout=10) as c:
            body = {"messages": USER, "stream": True}
            async with c.stream("POST", "/v1/chat/completions", json=body) as r:
                await anext(r.aiter_lines())
                t0 = time.perf_counter()
                busy = await c.post("/v1/chat/completions", json={"messages": USER})
                assert time.perf_counter() - t0 < 4  # not queued behind the 6 s stream
                assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
                assert busy.json()["error"]["code"] == "server_overloaded"
            await until(lambda: s.app.state.admission.in_flight == 0, 5)
            assert (await c.post("/v1/chat/completions", json={"messages": USER})).status_code == 200
        assert s.count("rejected") == 1


def test_health_while_starting_then_ready() -> None:
    gate = threading.Event()
    with serve_fake(wait_healthy=None, start_gate=gate) as s:
        h = httpx.get(f"{s.url}/health")
        assert h.status_code == 503 and h.json()["status"] == "starting"
        r = httpx.post(f"{s.url}/v1/chat/completions", json={"messages": USER})
        assert r.status_code == 503 and r.json()["error"]["code"] == "service_unavailable"
        assert httpx.get(f"{s.url}/v1/models").status_code == 200  # known from the profile
        gate.set()
        wait_until(lambda: httpx.get(f"{s.url}/health").status_code == 200, 5, "the engine ready")
        assert httpx.get(f"{s.url}/health").json() == {"status": "ok"}
        assert s.count("unavailable") == 1
    assert s.engine.closed  # closed by the lifespan at shutdown


def test_health_when_start_failed() -> None:
    with serve_fake(wait_healthy=None, fail_start=True) as s:
        wait_until(lambda: httpx.get(f"{s.url}/health").json()["status"] != "starting", 5, "the start failed")
        h = httpx.get(f"{s.url}/health")
        assert h.status_code == 503 and h.json() == {
            "status": "failed",
            "error": "RuntimeError: weights not found",
        }
        assert httpx.post(f"{s.url}/v1/chat/completions", json={"messages": USER}).status_code == 503


def test_openai_sdk_reads_both_shapes(srv: FakeServer) -> None:
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0)
    done = client.chat.completions.create(
        model="omnivoice",
        messages=USER,
        modalities=["text", "audio"],
        audio={"voice": "ethan", "format": "wav"},
    )
    assert done.choices[0].message.content == FULL_TEXT
    pcm, rate = decode_wav(base64.b64decode(done.choices[0].message.audio.data))
    assert rate == SAMPLE_RATE and pcm.size == SCRIPT.audio_chunks * SCRIPT.chunk_samples
    assert done.choices[0].message.audio.transcript == FULL_TEXT
    assert done.choices[1].message.audio.data == done.choices[0].message.audio.data  # vLLM-Omni's choice 1
    assert done.usage.completion_tokens == len(SCRIPT.texts)

    stream = client.chat.completions.create(
        model="omnivoice", messages=USER, stream=True, audio={"voice": "ethan", "format": "pcm16"}
    )
    text, audio = "", b""
    for chunk in stream:
        delta = chunk.choices[0].delta
        if chunk.model_extra["modality"] == "audio":
            audio += base64.b64decode(delta.audio.data)  # typed in recent SDKs (ChoiceDeltaAudio)
        else:
            text += delta.content or ""
    assert text == FULL_TEXT and len(audio) == 2 * SCRIPT.audio_chunks * SCRIPT.chunk_samples


def test_metrics_after_requests(srv: FakeServer) -> None:
    with httpx.stream(
        "POST", f"{srv.url}/v1/chat/completions", json={"messages": USER, "stream": True}, timeout=10
    ) as r:
        r.read()
    m = httpx.get(f"{srv.url}/metrics")
    assert m.status_code == 200 and m.headers["content-type"].startswith("text/plain")
    reg = srv.app.state.metrics.registry
    assert reg.get_sample_value("omnivoice_time_to_first_token_seconds_count") >= 1
    assert reg.get_sample_value("omnivoice_time_to_first_audio_seconds_count") >= 1
    assert reg.get_sample_value("omnivoice_real_time_factor_count") >= 1
    assert reg.get_sample_value("omnivoice_audio_seconds_total") >= 0.3
    assert reg.get_sample_value("omnivoice_requests_total", {"status": "ok"}) >= 1
    for line in (
        'omnivoice_stage_queued{stage="talker"} 0.0',
        'omnivoice_stage_running{stage="thinker"} 0.0',
        'omnivoice_stage_last_batch_size{stage="code2wav"} 0.0',
        'omnivoice_stage_steps_total{stage="thinker"} 7.0',
        "omnivoice_engine_active_requests 0.0",
        "omnivoice_requests_in_flight 0.0",
    ):
        assert line in m.text


def test_a_dead_stage_worker_turns_health_and_requests_into_503() -> None:
    with serve_fake() as s:
        assert httpx.get(f"{s.url}/health").status_code == 200
        s.engine.failure = "stage worker stopped: omnivoice-talker (exit code -9)"
        h = httpx.get(f"{s.url}/health")
        assert h.status_code == 503 and h.json()["status"] == "failed"
        assert "omnivoice-talker" in h.json()["error"]
        r = httpx.post(f"{s.url}/v1/chat/completions", json={"messages": USER})
        assert r.status_code == 503 and "omnivoice-talker" in r.json()["error"]["message"]
