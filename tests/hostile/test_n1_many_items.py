"""N1: one realtime client adds 10,000 text items, then asks for a response. The conversation holds
at most realtime.max_conversation_items (the rest are refused with conversation_full), the prompt is
fitted with a logarithmic number of tokenizations (never one per item), and `/health` answers
throughout."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
import websockets

from tests.hostile.conftest import url_of
from tests.support.hostile import EventReader, HealthProbe
from tests.support.serve_process import ServeProcess

pytestmark = pytest.mark.slow

ITEMS = 10_000
LIMIT = 2000  # realtime.max_conversation_items' default


def _item(n: int) -> dict[str, Any]:
    text = f"note {n}: " + "the quick brown fox jumps over the lazy dog " * 2
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    return {"type": "conversation.item.create", "item": item}


@pytest.mark.timeout(900)
async def test_ten_thousand_items_then_a_response(hostile_server: ServeProcess) -> None:
    base = url_of(hostile_server)
    url = base.replace("http", "ws") + "/v1/realtime"
    session = {"type": "realtime", "output_modalities": ["text"], "max_output_tokens": 4}
    with HealthProbe(base) as probe:
        # (no client pings: a server working through a backlog reads the socket, and so a ping, late)
        async with websockets.connect(url, max_size=None, ping_interval=None) as ws:
            reader = EventReader(ws)
            await reader.until(lambda e: e["type"] == "session.created", 30)
            await ws.send(json.dumps({"type": "session.update", "session": session}))
            await reader.until(lambda e: e["type"] == "session.updated", 30)
            t_send = time.monotonic()
            for n in range(ITEMS):
                await ws.send(json.dumps(_item(n)))
            # every item is answered: added, or refused past the limit
            answered = lambda e: reader.count("conversation.item.done") + reader.count("error") >= ITEMS  # noqa: E731
            t_sent = time.monotonic()
            await reader.until(answered, 600)
            added = reader.count("conversation.item.done")
            asked = time.monotonic()
            await ws.send(json.dumps({"type": "response.create"}))
            done = await reader.until(lambda e: e["type"] == "response.done", 60)
            took = time.monotonic() - asked
            await reader.close()
    assert added == LIMIT
    # the response's own item made room by dropping the oldest one, and said so
    assert reader.count("conversation.item.deleted") == 1
    assert reader.count("error", "conversation_full") == ITEMS - LIMIT
    assert reader.count("error") == ITEMS - LIMIT, [e for e in reader.events if e["type"] == "error"][-1:]
    assert done["response"]["status"] in ("completed", "incomplete"), done  # (incomplete: max_output_tokens)
    assert done["response"]["usage"]["input_tokens"] > 0
    assert took < 10, f"response.done {took:.1f} s after response.create"
    assert probe.failed == 0 and probe.count > 5
    phases = f"send {t_send:.1f} sent {t_sent:.1f} asked {asked:.1f} slow {probe.slow[:5]}"
    assert probe.worst < 0.5, f"/health took up to {probe.worst:.3f} s; {phases}"
    state = httpx.get(base + "/v1/debug/state", timeout=60).json()
    assert state["realtime"]["websocket"] == 0  # the session was released when the client left
