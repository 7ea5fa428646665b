"""Oversized prompts over a real server and the tiny model (a real tokenizer): refused at once (chat:
`context_length_exceeded`; realtime text: `string_above_max_length`), without stalling other clients or
keeping the memory they took."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from tests.support.serve import ServerThread, serve_tiny

pytestmark = pytest.mark.slow

HUGE = 3_000_000  # characters of prompt text: a few MB, under the default 25 MB body limit


@pytest.fixture(scope="module")
def server(tiny_checkpoint: Path) -> Iterator[ServerThread]:
    with serve_tiny(tiny_checkpoint) as st:
        yield st


class HealthProbe:
    """Polls `/health` from its own thread and keeps the slowest answer's latency."""

    def __init__(self, base_url: str) -> None:
        self._client = httpx.Client(base_url=base_url, timeout=60)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health-probe", daemon=True)
        self.worst = 0.0
        self.count = 0

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.perf_counter()
            assert self._client.get("/health").status_code == 200
            self.worst = max(self.worst, time.perf_counter() - began)
            self.count += 1
            time.sleep(0.005)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)
        self._client.close()


def _rss(client: httpx.Client) -> int:
    return client.get("/v1/debug/state").json()["process"]["rss_bytes"]


def _chat(client: httpx.Client, text: str) -> httpx.Response:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": text}], "max_tokens": 2}
    return client.post("/v1/chat/completions", json={**body, "modalities": ["text"]})


def test_a_prompt_of_megabytes_is_refused_at_once_without_stalling_others(server: ServerThread) -> None:
    with httpx.Client(base_url=server.base_url, timeout=120) as c:
        assert _chat(c, "hello there").status_code == 200
        before = _rss(c)
        for text in ("a" * HUGE, "hello world " * (HUGE // 12)):  # one endless word; many words
            with HealthProbe(server.base_url) as probe:
                time.sleep(0.05)
                r = _chat(c, text)
                time.sleep(0.05)
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
            assert probe.count > 2 and probe.worst < 0.25, f"/health took up to {probe.worst:.3f} s"
        grown = _rss(c) - before
        assert grown < 200e6, f"the server kept {grown / 1e6:.0f} MB after refusing the prompts"
        assert _chat(c, "hello there").status_code == 200


async def test_realtime_text_no_prompt_can_hold_is_refused_before_it_is_kept(server: ServerThread) -> None:
    url = server.base_url.replace("http", "ws") + "/v1/realtime"
    huge = "a" * HUGE
    user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": huge}]}
    events = [
        ({"type": "conversation.item.create", "item": user}, "item.content"),
        ({"type": "session.update", "session": {"instructions": huge}}, "session.instructions"),
        ({"type": "response.create", "response": {"instructions": huge}}, "response.instructions"),
    ]
    async with websockets.connect(url, max_size=None) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        for event, param in events:
            with HealthProbe(server.base_url) as probe:
                await ws.send(json.dumps(event))
                reply = json.loads(await asyncio.wait_for(ws.recv(), 30))
            assert reply["type"] == "error", reply["type"]
            assert reply["error"]["code"] == "string_above_max_length" and reply["error"]["param"] == param
            assert probe.worst < 0.25, f"/health took up to {probe.worst:.3f} s"
        (session,) = server.server.config.app.state.realtime.sessions.values()
        assert not session.conversation.items and session.settings.instructions is None
