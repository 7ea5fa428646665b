"""N3, N4: grammars are vetted before a request reaches the thinker. Costly or unusable schemas are
400 invalid_schema naming the parameter (chat) or an error event at session.update (realtime), never
a 500 or a late engine_error, and eight of them at once leave a bystander chat unhurt."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import websockets

from tests.hostile.conftest import url_of
from tests.support.hostile import EventReader
from tests.support.serve_process import ServeProcess

pytestmark = pytest.mark.slow

COSTLY = {
    "type": "object",
    "properties": {"a": {"type": "string", "pattern": "^(a{1000}){1000}$"}},
    "required": ["a"],
}
REFUSED = {
    "a pattern over the lexer's limits": {"type": "string", "pattern": "a{1000000}"},
    "a required recursive $ref": {"type": "object", "properties": {"n": {"$ref": "#"}}, "required": ["n"]},
    "a bare self-reference": {"$ref": "#"},
    "a $ref cycle": {
        "$defs": {"a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}}, "required": ["b"]},
                  "b": {"$ref": "#/$defs/a"}},
        "$ref": "#/$defs/a",
    },
}  # fmt: skip


def _parameters(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` as a function's parameters: an object (a schema that is not one becomes a property)."""
    if schema.get("type") == "object" or "$defs" in schema:
        return {"type": "object", **schema}
    return {"type": "object", "properties": {"x": schema}, "required": ["x"]}


def _chat(client: httpx.Client, schema: dict[str, Any] | None) -> httpx.Response:
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "modalities": ["text"],
    }
    if schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    return client.post("/v1/chat/completions", json=body)


def _errors(client: httpx.Client) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith('omnivoice_requests_total{status="error"}'):
            return float(line.split()[-1])
    return 0.0


def test_costly_patterns_leave_a_bystander_unhurt(hostile_server: ServeProcess) -> None:
    with httpx.Client(base_url=url_of(hostile_server), timeout=120) as c:
        assert _chat(c, None).status_code == 200  # warm
        with ThreadPoolExecutor(9) as pool:
            costly = [pool.submit(_chat, c, COSTLY) for _ in range(8)]
            time.sleep(0.05)
            began = time.perf_counter()
            bystander = _chat(c, None)
            took = time.perf_counter() - began
            answers = [f.result() for f in costly]
        assert bystander.status_code == 200, bystander.text
        assert took < 2, f"the bystander took {took:.2f} s"
        for r in answers:
            assert r.status_code == 400, r.text
            assert r.json()["error"]["code"] == "invalid_schema"
            assert r.json()["error"]["param"] == "response_format"


@pytest.mark.parametrize("name", list(REFUSED))
def test_schemas_over_the_limits_are_400s(hostile_server: ServeProcess, name: str) -> None:
    schema = REFUSED[name]
    with httpx.Client(base_url=url_of(hostile_server), timeout=120) as c:
        errors = _errors(c)
        r = _chat(c, _parameters(schema))
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == "invalid_schema", error
        assert error["param"] == "response_format"
        tool = {"type": "function", "function": {"name": "f", "parameters": _parameters(schema)}}
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "modalities": ["text"]}
        r = c.post("/v1/chat/completions", json={**body, "tools": [tool], "tool_choice": "required"})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"].startswith("tools"), r.text
        assert _errors(c) == errors  # refusals, not server errors


async def test_realtime_tools_over_the_limits_are_refused_at_session_update(
    hostile_server: ServeProcess,
) -> None:
    url = url_of(hostile_server).replace("http", "ws") + "/v1/realtime"
    async with websockets.connect(url, max_size=None) as ws:
        reader = EventReader(ws)
        await reader.until(lambda e: e["type"] == "session.created", 30)
        for n, schema in enumerate(REFUSED.values()):
            tool = {"type": "function", "name": "f", "parameters": _parameters(schema)}
            session = {"type": "realtime", "tools": [tool], "tool_choice": "required"}
            await ws.send(json.dumps({"type": "session.update", "session": session, "event_id": f"ev{n}"}))
            event = await reader.until(
                lambda e, n=n: (
                    e.get("event_id") == f"ev{n}"
                    or (e["type"] == "error" and e["error"].get("event_id") == f"ev{n}")
                ),
                60,
            )
            assert event["type"] == "error", event
            # (invalid_value: a parameters schema the session's own validation refuses first)
            assert event["error"]["code"] in ("invalid_schema", "invalid_value"), event
            assert event["error"]["param"].startswith("session.tools"), event
        assert reader.count("session.updated") == 0
        await reader.close()
