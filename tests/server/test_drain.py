"""The drain (omnivoice.server.drain) over a real server and the fake engine: once it starts, new
requests and connections are refused, idle realtime sessions are closed with a notice, responses in
flight finish, and what is still running at the timeout is cut with a notice."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
import websockets
import yaml

from omnivoice.config import parse_profile
from omnivoice.server import create_app
from omnivoice.server.drain import in_flight
from tests.support.fake_engine import FakeEngine, Script
from tests.support.realtime_client import Recorder, client
from tests.support.requests import streamed_audio_chat
from tests.support.serve import serve_thread
from tests.support.serve_process import ServeProcess, descendants, running, write_profile
from tests.support.twilio_carrier import call
from tests.support.webrtc_client import connect

DRAIN_S = 3.0  # the first test's drain window
LONG = Script(texts=("x",) * 600, audio_chunks=0, delay=0.02)  # 12 s: cut by the drain
SHORT = Script(texts=("y",) * 20, audio_chunks=3, delay=0.02)  # 0.5 s: finishes within it
ITEM = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}


async def test_drain_refuses_new_work_lets_responses_finish_and_cuts_the_rest() -> None:
    engines: list[FakeEngine] = []
    app = create_app(
        parse_profile({"server": {"drain_timeout_s": DRAIN_S}}), FakeEngine.factory(LONG, engines=engines)
    )
    with serve_thread(app) as st:
        url, state, engine = st.base_url, app.state, engines[0]
        async with httpx.AsyncClient(base_url=url, timeout=20) as c:
            body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
            async with (
                c.stream("POST", "/v1/chat/completions", json=body) as long_stream,
                client(url).realtime.connect(model="omnivoice") as idle,
                client(url).realtime.connect(model="omnivoice") as busy,
            ):
                lines = long_stream.aiter_lines()
                assert (await anext(lines)).startswith("data: ")
                idle_rec, busy_rec = Recorder(idle), Recorder(busy)
                for rec in (idle_rec, busy_rec):
                    await rec.next("session.created")
                await busy.conversation.item.create(item=ITEM)  # type: ignore[arg-type]
                await busy_rec.next("conversation.item.done")
                engine.script = SHORT
                await busy.response.create()
                await busy_rec.next("response.created")

                loop = st.server.servers[0].get_loop()
                t0 = time.monotonic()
                drained = asyncio.run_coroutine_threadsafe(state.drain.run(lambda: in_flight(state)), loop)
                while not state.drain.draining:
                    await asyncio.sleep(0.01)
                assert engine.restarts_held  # a stage worker dying now would not be restarted

                async with httpx.AsyncClient(base_url=url, timeout=5) as fresh:  # a new connection
                    r = await fresh.post("/v1/chat/completions", json={"messages": body["messages"]})
                    assert r.status_code == 503 and r.json()["error"]["code"] == "server_shutting_down"
                    assert r.headers["retry-after"] == "5" and r.headers["connection"] == "close"
                    health = await fresh.get("/health")
                    assert health.status_code == 503 and health.json() == {"status": "draining"}
                async with websockets.connect(url.replace("http", "ws") + "/v1/realtime") as ws:
                    with pytest.raises(websockets.ConnectionClosed) as refused:
                        await ws.recv()
                assert refused.value.rcvd is not None and refused.value.rcvd.code == 1013
                assert "shutting down" in refused.value.rcvd.reason

                # idle: closed at once, not when the window ends
                err_event = await idle_rec.next("error", timeout=5)
                assert err_event.error.code == "server_shutting_down"
                assert idle_rec.time_of(err_event) - t0 < DRAIN_S - 0.5
                done = (await busy_rec.next("response.done", timeout=5)).response  # finishes
                assert done.status == "completed"
                assert (await busy_rec.next("error", timeout=5)).error.code == "server_shutting_down"
                for rec in (idle_rec, busy_rec):
                    await asyncio.wait_for(rec._task, 5)  # the server closed the socket...
                assert idle._connection.close_code == busy._connection.close_code == 1001

                rest = [line async for line in lines if line]  # cut at the drain's expiry, with a notice
                assert rest[-1] == "data: [DONE]"
                notice = json.loads(rest[-2].removeprefix("data: "))
                assert notice["error"]["code"] == "server_shutting_down"
                assert time.monotonic() - t0 > DRAIN_S - 0.2  # the window's end, not before
        await asyncio.wrap_future(drained)
        assert in_flight(state) == 0 and state.admission.in_flight == 0
        assert len(engine.aborted) == 1 and engine.running == set()
        registry = state.metrics.registry
        assert registry.get_sample_value("omnivoice_requests_total", {"status": "cancelled"}) == 1


async def test_drain_ends_webrtc_calls_and_phone_calls_with_a_notice() -> None:
    app = create_app(parse_profile({"server": {"drain_timeout_s": 10.0}}), FakeEngine.factory(SHORT))
    with serve_thread(app) as st:
        state = app.state
        rtc = await connect(st.base_url)
        try:
            await rtc.next("session.created")
            async with call(st.base_url) as phone:
                await phone.connected()
                await phone.start()
                while len(state.realtime.sessions) < 2:
                    await asyncio.sleep(0.01)
                loop = st.server.servers[0].get_loop()
                t0 = time.monotonic()
                drained = asyncio.run_coroutine_threadsafe(state.drain.run(lambda: in_flight(state)), loop)
                notice = await rtc.next("error", timeout=5)  # on the data channel, then the peer closes
                assert notice["error"]["code"] == "server_shutting_down"
                await asyncio.wait_for(phone.closed.wait(), 5)
                assert phone.ws.close_code == 1001
                await asyncio.wrap_future(drained)
                assert time.monotonic() - t0 < 8.0  # nothing was in flight: no waiting for the 10 s window
            while rtc.pc.connectionState not in ("closed", "failed") and time.monotonic() - t0 < 10:
                await asyncio.sleep(0.05)
            assert rtc.pc.connectionState in ("closed", "failed") or rtc.channel.readyState == "closed"
            assert not state.webrtc.calls and not state.realtime.sessions and in_flight(state) == 0
        finally:
            await rtc.close()


# ---- `omnivoice serve` as a real process, SIGTERM ---------------------------------------------------


async def _event_size_limits(url: str) -> None:
    """realtime.max_event_bytes (64 KiB here): a larger event gets an error event; a frame over twice
    that is refused by the WebSocket layer of `omnivoice serve` (close 1009)."""
    big = {"type": "session.update", "session": {"instructions": "x" * 100_000}}
    async with websockets.connect(url.replace("http", "ws") + "/v1/realtime", max_size=None) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        await ws.send(json.dumps(big))
        assert json.loads(await ws.recv())["error"]["code"] == "event_too_large"
        await ws.send(json.dumps({**big, "session": {"instructions": "x" * 200_000}}))
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await ws.recv()
        codes = {c.code for c in (closed.value.rcvd, closed.value.sent) if c is not None}
        assert codes == {1009}, codes


async def test_omnivoice_serve_drains_on_sigterm_and_exits_0(tiny_checkpoint: Path, tmp_path: Path) -> None:
    stage = {"max_seq_len": 1024}  # worker: process (the default): stage processes and shared memory
    profile = {
        "model": {"path": str(tiny_checkpoint)},
        "server": {"port": 0, "drain_timeout_s": 8.0},  # the short response ends well within it
        "realtime": {"max_audio_ahead_ms": 600_000, "max_event_bytes": 64 * 1024},
        "stages": {"thinker": stage, "talker": stage, "code2wav": stage},
    }
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(profile))
    server = ServeProcess(path)
    try:
        url = await asyncio.to_thread(server.wait_ready, 240)
        pid = server.proc.pid
        children = descendants(pid)
        assert children  # the stage processes
        await _event_size_limits(url)
        long_chat = streamed_audio_chat(900)  # 72 s of audio: still streaming when the drain expires
        async with (
            httpx.AsyncClient(base_url=url, timeout=60) as c,
            c.stream("POST", "/v1/chat/completions", json=long_chat) as stream,
            client(url).realtime.connect(model="omnivoice") as conn,
        ):
            lines = stream.aiter_lines()
            assert (await anext(lines)).startswith("data: ")
            rec = Recorder(conn)
            await rec.next("session.created")
            short = {"type": "realtime", "omnivoice": {"min_output_tokens": 4, "output_audio_frames": 24}}
            await conn.session.update(session=short)  # type: ignore[arg-type]
            await conn.conversation.item.create(item=ITEM)  # type: ignore[arg-type]
            await rec.next("conversation.item.done")
            await conn.response.create()
            await rec.next("response.created")

            t0 = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            async with httpx.AsyncClient(base_url=url, timeout=10) as fresh:
                r = await fresh.get("/v1/models")
                while r.status_code == 200 and time.monotonic() - t0 < 2:  # the signal is on its way
                    await asyncio.sleep(0.02)
                    r = await fresh.get("/v1/models")
                assert r.status_code == 503 and r.json()["error"]["code"] == "server_shutting_down"

            done = (await rec.next("response.done", timeout=30)).response  # the response in flight ends
            if done.status == "cancelled":  # a machine too busy to finish it within the window: cut
                assert done.status_details is not None
                assert done.status_details.reason == "server_shutting_down", done.status_details
            else:
                assert done.status in ("completed", "incomplete"), done.status_details
            assert (await rec.next("error", timeout=30)).error.code == "server_shutting_down"
            await asyncio.wait_for(rec._task, 30)
            assert conn._connection.close_code == 1001

            rest = [line async for line in lines if line]  # cut at the drain's expiry, with the notice
            assert rest[-1] == "data: [DONE]", rest[-3:]
            assert json.loads(rest[-2].removeprefix("data: "))["error"]["code"] == "server_shutting_down"
            assert time.monotonic() - t0 > 7.5  # cut when the window ended, not before
        rc = await asyncio.to_thread(server.proc.wait, 60)
        assert rc == 0, server.log[-3000:]
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()
    deadline = time.monotonic() + 10
    while running(children) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert not running(children), running(children)  # stage processes left behind
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"omnivoice{pid}_")]
    await asyncio.to_thread(server.wait_log_closed, 30)  # the resource tracker writes last
    assert "draining" in server.log and "Traceback" not in server.log, server.log[-3000:]
    assert "leaked" not in server.log, server.log[-3000:]  # e.g. a stage process's semaphores


async def test_a_sigterm_to_the_whole_process_group_drains_and_stops_the_stages_cleanly(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """systemd's stop (and a terminal's Ctrl-C) signals the whole process group, the stage processes
    too: they leave stopping to the server, so the response in flight ends normally, no stage is
    restarted, each stage stops when the server says so, and nothing but the log is printed at exit."""
    path = write_profile(tmp_path, tiny_checkpoint, server={"port": 0, "drain_timeout_s": 60.0})
    server = ServeProcess(path, env={"OMNIVOICE_RUN_DIR": str(tmp_path / "run")}, own_group=True)
    try:
        url = await asyncio.to_thread(server.wait_ready, 240)
        pid = server.proc.pid
        children = descendants(pid)
        chat = streamed_audio_chat(150)  # several vocoder chunks: still generating when the signal lands
        async with (
            httpx.AsyncClient(base_url=url, timeout=120) as c,
            c.stream("POST", "/v1/chat/completions", json=chat) as stream,
        ):
            lines = stream.aiter_lines()
            assert (await anext(lines)).startswith("data: ")
            os.killpg(pid, signal.SIGTERM)
            rest = [line async for line in lines if line]
        rc = await asyncio.to_thread(server.proc.wait, 120)
        await asyncio.to_thread(server.wait_log_closed, 30)
    finally:
        server.kill()
    log = server.log
    assert rest[-1] == "data: [DONE]", rest[-3:]
    chunks = [json.loads(line.removeprefix("data: ")) for line in rest[:-1]]
    assert not [c for c in chunks if "error" in c], log[-3000:]
    finish = [ch["finish_reason"] for c in chunks for ch in c.get("choices", []) if ch.get("finish_reason")]
    assert finish and set(finish) == {"length"}, finish
    assert rc == 0, log[-3000:]
    assert "stage worker stopped" not in log and "restarting the stages" not in log, log[-3000:]
    for stage in ("thinker", "talker", "code2wav"):
        assert f"{stage} stage stopping" in log  # on the server's Shutdown, not killed by the signal
    deadline = time.monotonic() + 10
    while running(children) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert not running(children), running(children)  # stage processes left behind
    assert not list((tmp_path / "run").glob("*.json"))  # a clean stop leaves nothing to reclaim
    assert "nanobind" not in log and "Traceback" not in log, log[-3000:]
