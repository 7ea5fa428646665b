"""`response_format` on chat completions: what grammar each asks the engine for, and the 400 for a
schema that cannot be used, against a real server over the fake engine (the real engine's answers
are in test_e2e_chat.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from omnivoice.types import Grammar
from tests.support.fake_engine import FakeServer, serve_fake

USER = [{"role": "user", "content": "the weather in Oslo, as JSON"}]
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
}


@pytest.fixture(scope="module")
def srv() -> Iterator[FakeServer]:
    with serve_fake() as s:
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
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def _grammar(srv: FakeServer, client: httpx.Client, response_format: Any) -> Grammar | None:
    r = post(client, messages=USER, modalities=["text"], response_format=response_format)
    assert r.status_code == 200, r.text
    return srv.engine.requests[-1].thinker.grammar


def test_each_response_format_asks_for_its_grammar(srv: FakeServer, client: httpx.Client) -> None:
    assert _grammar(srv, client, {"type": "text"}) is None
    assert _grammar(srv, client, None) is None
    json_object = _grammar(srv, client, {"type": "json_object"})
    assert json_object is not None and json_object.kind == "json_schema"
    assert json.loads(json_object.source) == {"type": "object"}
    spec = {"name": "weather", "schema": WEATHER, "strict": True}
    schema = _grammar(srv, client, {"type": "json_schema", "json_schema": spec})
    assert schema is not None and schema.kind == "json_schema" and json.loads(schema.source) == WEATHER


def test_streamed_requests_are_constrained_too(srv: FakeServer, client: httpx.Client) -> None:
    body = {"messages": USER, "stream": True, "response_format": {"type": "json_object"}}
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        r.read()
    assert srv.engine.requests[-1].thinker.grammar is not None


@pytest.mark.parametrize("stream", [False, True])
def test_a_schema_that_cannot_be_used_is_a_400(client: httpx.Client, stream: bool) -> None:
    spec = {"name": "weather", "schema": {"type": "object", "properties": {"city": {"type": "town"}}}}
    fmt = {"type": "json_schema", "json_schema": spec}
    e = error(post(client, messages=USER, stream=stream, response_format=fmt), 400)
    assert e["param"] == "response_format" and e["code"] == "invalid_schema"
    assert "Invalid type: town" in e["message"]


@pytest.mark.parametrize(
    ("response_format", "param"),
    [
        ({"type": "xml"}, "response_format"),
        ({"type": "json_schema"}, "response_format.json_schema"),
        ({"type": "json_schema", "json_schema": {"schema": WEATHER}}, "response_format.json_schema.name"),
        ({"type": "json_schema", "json_schema": {"name": "a b"}}, "response_format.json_schema.name"),
        ({"type": "json_schema", "json_schema": {"name": "w", "schema": [1]}},
         "response_format.json_schema.schema"),
        ("json", "response_format"),
    ],
)  # fmt: skip
def test_a_malformed_response_format_is_a_400_naming_the_field(
    client: httpx.Client, response_format: Any, param: str
) -> None:
    e = error(post(client, messages=USER, response_format=response_format), 400)
    assert e["param"] == param, e


def test_the_sdk_gets_the_400(srv: FakeServer) -> None:
    sdk = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0)
    bad = {"name": "weather", "schema": {"$ref": "#/$defs/nowhere"}}
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(
            model="omnivoice", messages=USER, response_format={"type": "json_schema", "json_schema": bad}
        )
    assert refused.value.param == "response_format" and "does not exist" in refused.value.message
