"""N2: large images cost their encoded bytes, not their pixels. Eight solid 4096x4096 PNGs in one chat
(0.6 MB sent, ~390 MB each once decoded and patched) are refused from their headers within 2 s
without the server growing by 300 MB; realtime image items are held encoded (20 of them hold under
100 MB), within a per-session pixel budget."""

from __future__ import annotations

import base64
import io
import json
import time
from typing import Any

import httpx
import pytest
import websockets
from PIL import Image

from tests.hostile.conftest import url_of
from tests.support.hostile import EventReader
from tests.support.serve_process import ServeProcess

pytestmark = pytest.mark.slow

SIDE = 4096
BUDGET = 4 * SIDE * SIDE  # realtime.max_session_image_pixels' and server.max_request_image_pixels' default


@pytest.fixture(scope="module")
def solid_png() -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (SIDE, SIDE), (200, 30, 30)).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _rss(client: httpx.Client) -> int:
    return int(client.get("/v1/debug/state").json()["process"]["rss_bytes"])


def _chat(client: httpx.Client, url: str, images: int) -> tuple[httpx.Response, float]:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": url}}] * images
    content = [*parts, {"type": "text", "text": "what is this?"}]
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 2, "modalities": ["text"]}
    began = time.perf_counter()
    r = client.post("/v1/chat/completions", json=body)
    return r, time.perf_counter() - began


def test_chat_images_are_refused_from_their_headers(hostile_server: ServeProcess, solid_png: str) -> None:
    with httpx.Client(base_url=url_of(hostile_server), timeout=120) as c:
        before = _rss(c)
        r, took = _chat(c, solid_png, 8)  # over the request's pixel budget
        assert r.status_code == 400, r.text
        assert (
            r.json()["error"]["code"] == "image_budget_exceeded" and r.json()["error"]["param"] == "messages"
        )
        assert took < 2, f"refused after {took:.2f} s"
        r, took = _chat(c, solid_png, 2)  # within the budget, over the tiny model's context
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "context_length_exceeded"
        assert took < 2, f"refused after {took:.2f} s"
        grown = _rss(c) - before
        assert grown < 300e6, f"the server grew by {grown / 1e6:.0f} MB"


async def test_realtime_images_are_held_encoded_within_a_budget(
    hostile_server: ServeProcess, solid_png: str
) -> None:
    base = url_of(hostile_server)
    url = base.replace("http", "ws") + "/v1/realtime"
    item = {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": solid_png}]}
    with httpx.Client(base_url=base, timeout=120) as c:
        before = _rss(c)
        async with websockets.connect(url, max_size=None) as ws:
            reader = EventReader(ws)
            await reader.until(lambda e: e["type"] == "session.created", 30)
            update = {"type": "realtime", "output_modalities": ["text"], "max_output_tokens": 2}
            await ws.send(json.dumps({"type": "session.update", "session": update}))
            for _ in range(20):
                await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
            answered = lambda e: reader.count("conversation.item.done") + reader.count("error") >= 20  # noqa: E731
            await reader.until(answered, 120)
            held = _rss(c) - before
            await ws.send(json.dumps({"type": "response.create"}))
            done = await reader.until(lambda e: e["type"] == "response.done", 60)
            after_response = _rss(c) - before
            await reader.close()
    kept = BUDGET // (SIDE * SIDE)
    assert reader.count("conversation.item.done") == kept
    assert reader.count("error", "image_budget_exceeded") == 20 - kept
    assert held < 100e6, f"20 image items held {held / 1e6:.0f} MB"
    # the images' tokens alone exceed the tiny model's context: the response fails, nothing decoded
    assert done["response"]["status"] == "failed", done
    assert after_response < 100e6, f"the response grew the server by {after_response / 1e6:.0f} MB"
