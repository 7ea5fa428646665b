"""D1: a body at the size limit full of values (24 MB of `[]` in a field nobody reads), or nested
deeper than the bound, is refused before it is parsed (413 json_too_complex; realtime: an error
event) while `/health` answers within 500 ms."""

from __future__ import annotations

import json

import httpx
import pytest
import websockets

from tests.hostile.conftest import url_of
from tests.support.hostile import EventReader, HealthProbe
from tests.support.serve_process import ServeProcess

pytestmark = pytest.mark.slow

BRACKETS = 24 * 1024 * 1024 // 3  # `[],` each: 24 MB, under the default 25 MB body limit


def _body(junk: str) -> bytes:
    head = '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "junk": '
    return (head + junk + "}").encode()


def test_a_body_of_many_values_is_refused_before_parsing(hostile_server: ServeProcess) -> None:
    base = url_of(hostile_server)
    cases = [
        _body("[" + "[]," * (BRACKETS - 1) + "[]]"),  # values
        _body("[" * 500 + "]" * 500),  # nesting the value count allows, past the depth bound
    ]
    with httpx.Client(base_url=base, timeout=120) as c:
        for body in cases:
            with HealthProbe(base) as probe:
                r = c.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
            assert r.status_code == 413, r.text[:300]
            assert r.json()["error"]["code"] == "json_too_complex"
            assert probe.failed == 0 and probe.worst < 0.5, f"/health took up to {probe.worst:.3f} s"
        ok = c.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        )
        assert ok.status_code == 200, ok.text


async def test_a_realtime_event_of_many_values_is_refused(hostile_server: ServeProcess) -> None:
    base = url_of(hostile_server)
    junk = "[" + "[]," * (4 * 1024 * 1024 - 1) + "[]]"  # 12 MB, under realtime.max_event_bytes
    event = '{"type": "session.update", "session": {"type": "realtime"}, "junk": ' + junk + "}"
    with HealthProbe(base) as probe:
        async with websockets.connect(base.replace("http", "ws") + "/v1/realtime", max_size=None) as ws:
            reader = EventReader(ws)
            await reader.until(lambda e: e["type"] == "session.created", 30)
            await ws.send(event)
            error = await reader.until(lambda e: e["type"] == "error", 60)
            await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime"}}))
            await reader.until(lambda e: e["type"] == "session.updated", 60)  # the session goes on
            await reader.close()
    assert error["error"]["code"] == "json_too_complex", error
    assert probe.failed == 0 and probe.worst < 0.5, f"/health took up to {probe.worst:.3f} s"
