"""Request validation and the OpenAI error shape, against a real server over the fake engine."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest

from omnivoice.audio import encode_wav, pcm16_bytes
from omnivoice.types import AudioPart, TextPart
from tests.support.fake_engine import FakeServer, serve_fake

MAX_BODY = 256 * 1024
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def srv() -> Iterator[FakeServer]:
    with serve_fake(server={"max_body_bytes": MAX_BODY, "max_audio_seconds": 2.0}) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv: FakeServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.url, timeout=10) as c:
        yield c


def post(client: httpx.Client, **body: object) -> httpx.Response:
    return client.post("/v1/chat/completions", json=body)


def error(r: httpx.Response, status: int) -> dict:
    """Assert the OpenAI error shape and return its `error` object."""
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    return body["error"]


def wav_b64(seconds: float, rate: int = 16000) -> str:
    return base64.b64encode(encode_wav(np.zeros(int(seconds * rate), np.float32), rate)).decode()


def test_valid_request_with_tolerated_extras(client: httpx.Client) -> None:
    r = post(
        client, model="omnivoice", messages=[{"role": "user", "content": "hi", "name": "bob"}],
        user="u1", metadata={"a": "b"}, store=False, logprobs=False, modalities=["text"],
        frequency_penalty=0, tool_choice="none", parallel_tool_calls=False,
    )  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "Hello there, friend!"


def test_malformed_json(client: httpx.Client) -> None:
    r = client.post(
        "/v1/chat/completions", content=b'{"messages": [', headers={"content-type": "application/json"}
    )
    e = error(r, 400)
    assert e["type"] == "invalid_request_error" and e["code"] == "invalid_json"


def test_non_object_json(client: httpx.Client) -> None:
    assert error(client.post("/v1/chat/completions", json=[1, 2]), 400)["code"] == "invalid_json"


def test_wrong_content_type(client: httpx.Client) -> None:
    r = client.post("/v1/chat/completions", content=b"messages=hi", headers={"content-type": "text/plain"})
    assert "application/json" in error(r, 400)["message"]


def test_missing_content_type_is_read_as_json(client: httpx.Client) -> None:
    r = client.post("/v1/chat/completions", content=b'{"messages": [{"role": "user", "content": "hi"}]}')
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("body", "param", "needle"),
    [
        ({}, "messages", "Field required"),
        ({"messages": []}, "messages", "at least 1"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "'user'"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "string or a list"),
        ({"messages": USER, "modalities": ["video"]}, "modalities[0]", "'text' or 'audio'"),
        ({"messages": USER, "modalities": []}, "modalities", '["text"]'),
        ({"messages": USER, "modalities": ["text", "text"]}, "modalities", '["text"]'),
        ({"messages": USER, "audio": {"format": "mp3"}}, "audio.format", "'wav' or 'pcm16'"),
        ({"messages": USER, "n": 2}, "n", "only n=1"),
        ({"messages": USER, "temperature": 2.5}, "temperature", "less than or equal to 2"),
        ({"messages": USER, "top_p": 0}, "top_p", "greater than 0"),
        ({"messages": USER, "max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
        ({"messages": USER, "max_completion_tokens": -1}, "max_completion_tokens", "greater than or equal"),
        ({"messages": USER, "stream": "maybe"}, "stream", "boolean"),
        ({"messages": USER, "seed": "x"}, "seed", "integer"),
    ],
)
def test_schema_errors_name_the_field(client: httpx.Client, body: dict, param: str, needle: str) -> None:
    e = error(post(client, **body), 400)
    assert e["param"] == param
    assert needle in e["message"]


def test_a_tool_message_must_answer_an_earlier_call(client: httpx.Client) -> None:
    msgs = [*USER, {"role": "tool", "content": "42", "tool_call_id": "c1"}]
    e = error(post(client, messages=msgs), 400)
    assert e["param"] == "messages[1].tool_call_id" and "c1" in e["message"]


@pytest.mark.parametrize("kind", ["input_image", "video_url", "file"])
def test_other_parts_not_supported(client: httpx.Client, kind: str) -> None:
    content = [{"type": "text", "text": "what is this"}, {"type": kind, kind: {"url": "http://x/y.png"}}]
    e = error(post(client, messages=[{"role": "user", "content": content}]), 400)
    assert "not supported" in e["message"] and e["param"] == "messages[0].content"


def test_a_remote_image_url_is_refused(client: httpx.Client) -> None:
    content = [
        {"type": "text", "text": "what is this"},
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}},
    ]
    e = error(post(client, messages=[{"role": "user", "content": content}]), 400)
    assert e["param"] == "messages[0].content[1].image_url.url" and "fetches no http URL" in e["message"]


def test_unknown_part_type(client: httpx.Client) -> None:
    e = error(post(client, messages=[{"role": "user", "content": [{"type": "hologram"}]}]), 400)
    assert e["param"] == "messages[0].content[0]" and "hologram" in e["message"]


def test_missing_input_audio_data(client: httpx.Client) -> None:
    content = [{"type": "input_audio", "input_audio": {"format": "wav"}}]
    e = error(post(client, messages=[{"role": "user", "content": content}]), 400)
    assert e["param"] == "messages[0].content[0].input_audio.data"


def test_empty_content_and_non_text_assistant(client: httpx.Client) -> None:
    assert (
        error(post(client, messages=[{"role": "user", "content": None}]), 400)["param"]
        == "messages[0].content"
    )
    audio = [{"type": "input_audio", "input_audio": {"data": wav_b64(0.1), "format": "wav"}}]
    msgs = [*USER, {"role": "assistant", "content": audio}]
    assert "assistant content must be text" in error(post(client, messages=msgs), 400)["message"]


def test_unknown_voice_is_named(client: httpx.Client) -> None:
    e = error(post(client, messages=USER, audio={"voice": "alloy", "format": "wav"}), 400)
    assert e["param"] == "audio.voice" and "'alloy'" in e["message"] and "ethan" in e["message"]


def test_voice_not_checked_for_text_only(client: httpx.Client) -> None:
    assert post(client, messages=USER, modalities=["text"], audio={"voice": "alloy"}).status_code == 200


def test_unknown_model_is_404(client: httpx.Client) -> None:
    e = error(post(client, model="gpt-4o", messages=USER), 404)
    assert e["code"] == "model_not_found" and e["param"] == "model"


@pytest.mark.parametrize(
    ("audio", "code", "needle"),
    [
        ({"data": "%%%not-b64%%%", "format": "wav"}, "invalid_audio", "not valid base64"),
        ({"data": "AAAA", "format": "mp3"}, "invalid_audio", "'mp3'"),
        ({"data": base64.b64encode(b"junkjunkjunkjunk").decode(), "format": "wav"}, "invalid_audio", "RIFF"),
        ({"data": wav_b64(0.0), "format": "wav"}, "invalid_audio", "no samples"),
        ({"data": wav_b64(2.5), "format": "wav"}, "audio_too_long", "limit is 2 s"),
    ],
)
def test_bad_input_audio(client: httpx.Client, audio: dict, code: str, needle: str) -> None:
    content = [{"type": "text", "text": "listen"}, {"type": "input_audio", "input_audio": audio}]
    e = error(post(client, messages=[{"role": "user", "content": content}]), 400)
    assert e["code"] == code and e["param"] == "messages[0].content[1]" and needle in e["message"]


def test_input_audio_reaches_the_engine(client: httpx.Client, srv: FakeServer) -> None:
    pcm16 = base64.b64encode(pcm16_bytes(np.zeros(2400, np.float32))).decode()
    content = [
        {"type": "input_audio", "input_audio": {"data": wav_b64(0.5, 16000), "format": "wav"}},
        {"type": "input_audio", "input_audio": {"data": pcm16, "format": "pcm16"}},
        {"type": "audio_url", "audio_url": {"url": "data:audio/wav;base64," + wav_b64(0.25, 8000)}},
        {"type": "text", "text": "what did I say?"},
    ]
    msgs = [{"role": "developer", "content": "be brief"}, {"role": "user", "content": content}]
    assert post(client, messages=msgs).status_code == 200
    system, user = srv.engine.prompts[-1]
    assert system.role == "system" and system.parts == (TextPart("be brief"),)
    a, b, c, t = user.parts
    assert isinstance(a, AudioPart) and (a.sample_rate, a.pcm.size) == (16000, 8000)
    assert isinstance(b, AudioPart) and (b.sample_rate, b.pcm.size) == (24000, 2400)
    assert isinstance(c, AudioPart) and (c.sample_rate, c.pcm.size) == (8000, 2000)
    assert t == TextPart("what did I say?")


def test_audio_url_must_be_a_wav_data_url(client: httpx.Client) -> None:
    for url in ("https://example.com/a.wav", "data:audio/mpeg;base64,AAAA"):
        content = [{"type": "audio_url", "audio_url": {"url": url}}]
        assert (
            error(post(client, messages=[{"role": "user", "content": content}]), 400)["code"]
            == "invalid_audio"
        )


def test_prompt_error_from_engine_is_400(client: httpx.Client) -> None:
    e = error(post(client, messages=[{"role": "user", "content": "say FORBIDDEN"}]), 400)
    assert e["message"] == "the prompt contains a forbidden word" and e["param"] == "messages"


def test_prompt_too_long(client: httpx.Client) -> None:
    e = error(post(client, messages=[{"role": "user", "content": "word " * 300}]), 400)
    assert e["code"] == "context_length_exceeded"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"function_call": {"name": "f"}}, "function_call"),
        ({"logprobs": True}, "logprobs"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"logit_bias": {"42": 10}}, "logit_bias"),
        ({"stop": ["\n"]}, "stop"),
        ({"stop": "END"}, "stop"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"frequency_penalty": -1}, "frequency_penalty"),
        ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
        ({"reasoning_effort": "low"}, "reasoning_effort"),
        ({"web_search_options": {}}, "web_search_options"),
        ({"messages": [*USER, {"role": "assistant", "content": "ok", "function_call": {"name": "f"}}]},
         "messages[1].function_call"),
    ],
)  # fmt: skip
def test_unsupported_parameters_are_refused_by_name(client: httpx.Client, extra: dict, param: str) -> None:
    e = error(post(client, **{"messages": USER, **extra}), 400)
    assert e["param"] == param and e["code"] == "unsupported_parameter", e
    assert param in e["message"]


def test_the_sdk_sends_no_op_values_and_gets_unsupported_ones_refused(srv: FakeServer) -> None:
    sdk = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0)
    no_ops: dict = {
        "n": 1, "logprobs": False, "top_logprobs": 0, "tools": [], "tool_choice": "none", "stop": None,
        "presence_penalty": 0.0, "frequency_penalty": 0, "logit_bias": {},
        "response_format": {"type": "text"}, "parallel_tool_calls": False, "service_tier": "auto",
        "user": "u1", "store": False,
    }  # fmt: skip
    done = sdk.chat.completions.create(model="omnivoice", messages=USER, modalities=["text"], **no_ops)
    assert done.choices[0].message.content == "Hello there, friend!"
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(model="omnivoice", messages=USER, logprobs=True, top_logprobs=2)
    assert refused.value.param == "logprobs" and refused.value.code == "unsupported_parameter"


def test_more_messages_than_a_prompt_can_hold_are_refused_before_validation(
    client: httpx.Client, srv: FakeServer
) -> None:
    limit = srv.engine.info.max_prompt_tokens  # each message costs a prompt at least 5 tokens
    e = error(post(client, messages=USER * (limit // 5 + 1)), 400)
    assert e["code"] == "context_length_exceeded" and e["param"] == "messages"
    parts = [{"type": "text", "text": "x"}] * (limit + 1)
    e = error(post(client, messages=[{"role": "user", "content": parts}]), 400)
    assert e["code"] == "context_length_exceeded" and "content parts" in e["message"]


def test_a_validation_error_lists_a_few_problems_not_all(client: httpx.Client) -> None:
    e = error(post(client, messages=USER, modalities=["x"] * 5000), 400)
    assert e["param"] == "modalities" and len(e["message"]) < 500


def test_sampling_and_modalities_reach_the_engine(client: httpx.Client, srv: FakeServer) -> None:
    body = {"messages": USER, "temperature": 0.7, "top_p": 0.9, "max_completion_tokens": 33, "seed": 5}
    assert post(client, **body, modalities=["text"]).status_code == 200
    req = srv.engine.requests[-1]
    assert (req.thinker.temperature, req.thinker.top_p, req.thinker.max_tokens, req.thinker.seed) == (
        0.7,
        0.9,
        33,
        5,
    )
    assert req.want_audio is False and req.talker.seed == 5 and req.talker.temperature == 0.0
    assert post(client, messages=USER, max_tokens=12, audio={"voice": "chelsie"}).status_code == 200
    req = srv.engine.requests[-1]
    assert req.thinker.max_tokens == 12 and req.want_audio and req.voice == "chelsie"
    assert req.thinker.temperature == 0.0 and req.thinker.seed is None  # profile defaults


def test_fixed_length_extensions(client: httpx.Client, srv: FakeServer) -> None:
    body = {"max_tokens": 40, "min_tokens": 30, "min_audio_frames": 50, "max_audio_frames": 60}
    assert post(client, messages=USER, **body).status_code == 200
    req = srv.engine.requests[-1]
    assert (req.thinker.min_tokens, req.thinker.max_tokens) == (30, 40)
    assert (req.talker.min_tokens, req.talker.max_tokens) == (50, 60)
    assert post(client, messages=USER, max_tokens=7, ignore_eos=True).status_code == 200
    assert srv.engine.requests[-1].thinker.min_tokens == 7
    assert post(client, messages=USER).status_code == 200
    req = srv.engine.requests[-1]
    assert (req.thinker.min_tokens, req.talker.min_tokens, req.talker.max_tokens) == (0, 0, 2048)


@pytest.mark.parametrize(
    ("body", "param", "needle"),
    [
        ({"max_tokens": 5, "min_tokens": 6}, "min_tokens", "exceeds max_tokens"),
        ({"min_audio_frames": 9, "max_audio_frames": 8}, None, "min_audio_frames must be <="),
        ({"max_audio_frames": 5000}, "max_audio_frames", "at most 2048"),
        ({"min_tokens": -1}, "min_tokens", "greater than or equal to 0"),
    ],
)
def test_fixed_length_errors(client: httpx.Client, body: dict, param: str | None, needle: str) -> None:
    e = error(post(client, messages=USER, **body), 400)
    assert e["param"] == param and needle in e["message"]


def test_unknown_route_and_method(client: httpx.Client) -> None:
    assert error(client.get("/v1/nothing"), 404)["code"] == "not_found"
    assert error(client.get("/v1/chat/completions"), 405)["code"] == "method_not_allowed"
    assert error(client.get("/v1/models/other"), 404)["code"] == "model_not_found"
    assert client.get("/v1/models/omnivoice").json()["id"] == "omnivoice"


def test_body_too_large_by_content_length(client: httpx.Client) -> None:
    r = post(client, messages=[{"role": "user", "content": "x" * MAX_BODY}])
    assert error(r, 413)["code"] == "request_too_large"


def test_body_too_large_when_chunked(client: httpx.Client) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(40):
            yield b"x" * 8192
        yield b'"}]}'

    r = client.post("/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"})
    assert "content-length" not in r.request.headers  # sent chunked
    error(r, 413)


def test_invalid_requests_are_counted(client: httpx.Client, srv: FakeServer) -> None:
    before = srv.count("invalid")
    error(post(client, messages=[]), 400)
    assert srv.count("invalid") == before + 1


def test_request_id_is_echoed(client: httpx.Client) -> None:
    r = client.post("/v1/chat/completions", json={"messages": USER}, headers={"x-request-id": "abc-123"})
    assert r.headers["x-request-id"] == "abc-123"
    assert len(client.get("/health").headers["x-request-id"]) == 16
