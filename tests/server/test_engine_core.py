"""The engine core in a process of its own (`stages.core: process`), over a real server and the tiny
model: the engine client in the server serves chat (the official `openai` client) and realtime through
it; a fresh server's capacity comes from the core's start-up calibration; the event loop keeps
answering `/health` and WebSocket pings while the core is stopped; and a core killed under a live
session fails the response in flight with the engine's error, keeps the session, says `restarting`
on `/health`, and answers the session's next turn from a fresh core."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import websockets

from omnivoice.types import HOPS
from tests.server.test_calibrated_capacity import scrape
from tests.support.polling import until, wait_until
from tests.support.realtime_client import Recorder, client
from tests.support.restart_turns import check_failed_then_answered, interrupted_turn, next_turn
from tests.support.serve import ServerThread, serve_tiny

pytestmark = pytest.mark.slow

USER = [{"role": "user", "content": "Hello there."}]
STAGE = {"worker": "thread", "max_seq_len": 1024, "max_batch": 4}


@pytest.fixture(scope="module")
def server(tiny_checkpoint: Path) -> Iterator[ServerThread]:
    code2wav = {**STAGE, "chunk": {"first_frames": 2, "frames": 4}}
    # calibrated at start, with few steps: the bursts stay short on a loaded CPU
    capacity = {"calibrate": True, "min_steps": 6}
    stages = {
        "core": "process",
        "thinker": STAGE,
        "talker": STAGE,
        "code2wav": code2wav,
        "capacity": capacity,
    }
    with serve_tiny(tiny_checkpoint, stages=stages) as st:
        yield st


def _engine(server: ServerThread) -> Any:
    return server.server.config.app.state.lifecycle.engine  # type: ignore[attr-defined]


def test_the_core_runs_apart_and_a_fresh_server_knows_its_capacity(server: ServerThread) -> None:
    engine = _engine(server)
    assert engine.core_pid is not None and engine.core_pid != os.getpid()
    m = scrape(server.base_url)
    # from the calibration, before any request (what a loaded CPU serves in real time may be none)
    assert m["omnivoice_engine_capacity_streams"][()] >= 0
    per_stage = {dict(k)["stage"] for k in m["omnivoice_stage_capacity_streams"]}
    assert per_stage == {"thinker", "talker", "code2wav"}
    for worker in engine.replica_stats():  # each stage timed steps of several sizes in the core
        assert len({b for b, _, n in worker.step_times if n >= 3}) >= 2, (worker.name, worker.step_times)
    assert m["omnivoice_event_loop_lag_seconds_count"][()] > 0
    wait_until(read_on_the_loop, 10, "the reader thread's hand-over to the event loop")


def test_chat_through_the_core_process(server: ServerThread) -> None:
    sdk = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0, timeout=300)
    stream = sdk.chat.completions.create(
        model="omnivoice", messages=USER, max_tokens=6, stream=True,  # type: ignore[arg-type]
        extra_body={"min_tokens": 6, "min_audio_frames": 6, "max_audio_frames": 6},
        modalities=["text", "audio"], audio={"voice": "ethan", "format": "pcm16"},
    )  # fmt: skip
    pcm, finish = b"", None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if chunk.model_extra and chunk.model_extra.get("modality") == "audio":
            pcm += base64.b64decode(delta.audio.data)  # type: ignore[attr-defined]
        finish = chunk.choices[0].finish_reason or finish
    assert finish is not None and len(pcm) > 0
    done = sdk.chat.completions.create(model="omnivoice", messages=USER, max_tokens=4)  # type: ignore[arg-type]
    assert done.choices[0].finish_reason in ("stop", "length") and done.usage is not None
    until_idle(server)

    def hops() -> dict[str, float]:
        counts = scrape(server.base_url).get("omnivoice_core_hop_seconds_count", {})
        return {dict(k)["hop"]: v for k, v in counts.items()}

    # both requests went to the core and their outputs came back, each way timed (the request hop
    # reaches the server with the core's next snapshot)
    wait_until(lambda: hops().get("request", 0) >= 2, 10, "the core's timing of the requests")
    counted = hops()
    assert set(counted) == set(HOPS) and all(counted[h] >= 2 for h in HOPS[1:]), counted
    assert scrape(server.base_url)["omnivoice_request_prepare_seconds_count"][()] >= 2


def until_idle(server: ServerThread) -> None:
    deadline = time.monotonic() + 30
    while _engine(server).stats().active_requests:
        assert time.monotonic() < deadline, "the core still holds requests"
        time.sleep(0.1)


async def test_the_event_loop_answers_while_the_core_is_stopped(server: ServerThread) -> None:
    engine = _engine(server)
    ws_url = server.base_url.replace("http", "ws", 1) + "/v1/realtime?model=omnivoice"
    pid = engine.core_pid
    async with websockets.connect(ws_url) as ws, httpx.AsyncClient(base_url=server.base_url) as http:
        os.kill(pid, signal.SIGSTOP)
        try:
            pings, health = [], []
            for _ in range(20):
                t0 = time.perf_counter()
                await (await ws.ping())
                pings.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                r = await http.get("/health", timeout=10)
                health.append(time.perf_counter() - t0)
                assert r.status_code == 200 and r.json()["status"] == "ok"
                await asyncio.sleep(0.02)
        finally:
            os.kill(pid, signal.SIGCONT)
    # the core takes no part in either: the medians are the loop's own (what the issue bounds)
    assert statistics.median(pings) < 0.05, pings
    assert statistics.median(health) < 0.05, health
    assert engine.core_pid == pid  # not taken for stuck within its stuck_after_s


@pytest.mark.timeout(1500)  # a server whose core is started twice on a loaded machine
async def test_a_killed_core_fails_the_response_keeps_the_session_and_the_next_turn_works(
    server: ServerThread,
) -> None:
    engine = _engine(server)
    before = engine.core_pid

    async def kill_the_core() -> None:
        os.kill(before, signal.SIGKILL)

    async with client(server.base_url).realtime.connect(model="omnivoice") as conn:
        rec = Recorder(conn)
        cut = await interrupted_turn(conn, rec, server.base_url, kill_the_core)
        await until(lambda: engine.capacity().streams is not None, 60, "the new core's capacity")
        done, audio = await next_turn(conn, rec)
        await rec.close()
    check_failed_then_answered(cut, done, audio)
    assert engine.core_pid not in (None, before)
    assert read_on_the_loop(), "the fresh core is read by a thread, not the event loop"


def read_on_the_loop() -> bool:
    """Whether no reader thread reads a core: the event loop reads the core's pipe itself."""
    return not any(t.name.startswith("core-reader-") for t in threading.enumerate())
