"""Admission from measured capacity over a real server and the tiny model: a talker slowed to well under
real time for two streams (each step sleeps per request in it: a fault a fast machine cannot cause
otherwise) makes the server refuse the next session while the admitted one goes on streaming, and
admit again once that one has ended."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from omnivoice.runners.talker import TalkerRunner
from tests.support.polling import until
from tests.support.realtime_client import ask_text, audio_until_done
from tests.support.serve import ServerThread, serve_tiny

SLOW_S = 0.05  # per request in a talker step: 2 streams need 100 ms a frame, over the 80 ms of audio
FRAMES = 40
TOKENS = 8
SESSION: dict[str, Any] = {
    "type": "realtime",
    "audio": {"input": {"turn_detection": None}},  # output: pcm16 at 24 kHz
    "max_output_tokens": TOKENS,
    "omnivoice": {"min_output_tokens": TOKENS, "output_audio_frames": FRAMES},
}


@pytest.fixture
def server(tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ServerThread]:
    step = TalkerRunner.step

    def slowed(self: TalkerRunner, defer_ahead: bool = False) -> list[Any]:
        outs = step(self, defer_ahead)
        time.sleep(SLOW_S * self._last_batch)
        return outs

    monkeypatch.setattr(TalkerRunner, "step", slowed)
    stage = {"worker": "thread", "max_seq_len": 1024, "max_batch": 4}  # threads: the slowed class runs
    stages = {"thinker": stage, "talker": stage, "code2wav": stage, "capacity": {"min_steps": 5}}
    with serve_tiny(tiny_checkpoint, realtime={"max_audio_ahead_ms": 600_000}, stages=stages) as st:
        yield st


async def test_a_slowed_stage_refuses_the_next_session_while_the_admitted_one_streams(
    server: ServerThread,
) -> None:
    url = server.base_url.replace("http", "ws") + "/v1/realtime"
    lifecycle = server.server.config.app.state.lifecycle  # type: ignore[attr-defined]

    def measured() -> bool:  # the talker's estimate: a stall alone refuses only until the stream is
        cap = lifecycle.capacity()  # ahead again, and a chat request after it could then be admitted
        return cap is not None and dict(cap.stages)["talker"] is not None

    async with websockets.connect(url, max_size=None) as admitted:
        await ask_text(admitted, SESSION)
        audio = 0
        while not measured():  # the talker's steps while it speaks are what is measured
            event = json.loads(await admitted.recv())
            assert event["type"] not in ("error", "response.done"), event
            if event["type"] == "response.output_audio.delta":
                audio += len(base64.b64decode(event["delta"]))
        cap = lifecycle.capacity()
        assert cap.streams is not None and cap.streams <= 1, cap
        async with websockets.connect(url) as refused:
            event = json.loads(await refused.recv())
            assert event["type"] == "error" and event["error"]["code"] == "server_overloaded", event
            await refused.wait_closed()
            assert refused.close_code == 1013
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as c:
            r = await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 503 and r.json()["error"]["code"] == "server_overloaded", r.text
        audio, done = await audio_until_done(admitted, audio)
        assert done["status"] in ("completed", "incomplete"), done  # incomplete: at max_output_tokens
        assert audio >= (FRAMES - 1) * 1920 * 2  # every frame of it (pcm16 at 24 kHz, 80 ms a frame)
    state = server.server.config.app.state  # type: ignore[attr-defined]
    await until(lambda: state.admission.streams == 0, 10, "the admitted session's stream given back")
    async with websockets.connect(url, max_size=None) as again:  # nothing promised: admitted again
        await ask_text(again, SESSION)
        audio, done = await audio_until_done(again)
        assert audio > 0
