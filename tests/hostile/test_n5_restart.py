"""N5: a realtime `response.create` while the engine's stages restart (a stage process was killed)
gets an `error` event of type server_error, code engine_restarting, and the server logs no traceback
for it; once the stages are back, responses work again."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import websockets

from tests.support.hostile import EventReader
from tests.support.serve_process import ServeProcess, stage_processes, write_profile

pytestmark = pytest.mark.slow


@pytest.fixture
def server(tiny_checkpoint: Path, tmp_path: Path) -> Iterator[ServeProcess]:
    s = ServeProcess(write_profile(tmp_path, tiny_checkpoint, worker="process"))
    try:
        s.base_url = s.wait_ready(300)  # type: ignore[attr-defined]
        yield s
    finally:
        s.kill()


def _stage_process(pid: int) -> int:
    for child in stage_processes(pid):
        return child
    raise AssertionError("no stage process found")


async def _health(base: str) -> str:
    async with httpx.AsyncClient(timeout=30) as c:  # (the test's loop keeps answering the pings)
        return str((await c.get(base + "/health")).json()["status"])


@pytest.mark.timeout(900)
async def test_a_response_during_a_restart_is_an_error_event(server: ServeProcess) -> None:
    base: str = server.base_url  # type: ignore[attr-defined]
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    async with websockets.connect(base.replace("http", "ws") + "/v1/realtime", max_size=None) as ws:
        reader = EventReader(ws)
        await reader.until(lambda e: e["type"] == "session.created", 30)
        session = {"type": "realtime", "output_modalities": ["text"], "max_output_tokens": 2}
        await ws.send(json.dumps({"type": "session.update", "session": session}))
        await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
        logged = len(server.lines)
        os.kill(_stage_process(server.proc.pid), signal.SIGKILL)
        deadline = time.monotonic() + 60
        while await _health(base) != "restarting":
            assert time.monotonic() < deadline, "the server never said it was restarting"
            await asyncio.sleep(0.05)
        await ws.send(json.dumps({"type": "response.create"}))
        done = await reader.until(lambda e: e["type"] == "response.done", 60)
        if done["response"]["status"] == "failed":
            error = next(e for e in reader.events if e["type"] == "error")
            assert error["error"]["type"] == "server_error" and error["error"]["code"] == "engine_restarting"
            assert done["response"]["status_details"]["error"]["code"] == "engine_restarting"
        else:  # (the stages came back before the response started: it was served)
            assert await _health(base) == "ok", done
        # the stages come back, and so do responses
        deadline = time.monotonic() + 180
        while await _health(base) != "ok":
            assert time.monotonic() < deadline, "the stages did not come back"
            await asyncio.sleep(0.2)
        await ws.send(json.dumps({"type": "response.create"}))
        last = await reader.until(lambda e: e["type"] == "response.done" and e is not done, 120)
        assert last["response"]["status"] in ("completed", "incomplete"), last
        await reader.close()
    log = "".join(server.lines[logged:])
    assert "Traceback" not in log and "response failed" not in log, log[-3000:]
