"""The drain (omnivoice.server.drain) over a real server and the fake engine: once it starts, new
requests and connections are refused, idle realtime sessions are closed with a notice, responses in
flight finish, and what is still running at the timeout is cut with a notice."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
import websockets

from omnivoice.config import parse_profile
from omnivoice.server import create_app
from omnivoice.server.drain import in_flight

from .fake_engine import FakeEngine, Script
from .realtime.fake import client
from .realtime.rt import Recorder
from .serve import serve_thread

LONG = Script(texts=("x",) * 400, audio_chunks=0, delay=0.02)  # 8 s: cut by the drain
SHORT = Script(texts=("y",) * 20, audio_chunks=3, delay=0.02)  # 0.5 s: finishes within it
ITEM = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}


async def test_drain_refuses_new_work_lets_responses_finish_and_cuts_the_rest() -> None:
    engines: list[FakeEngine] = []
    app = create_app(
        parse_profile({"server": {"drain_timeout_s": 2.0}}), FakeEngine.factory(LONG, engines=engines)
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

                err = (await idle_rec.next("error", timeout=5)).error  # idle: closed at once
                assert err.code == "server_shutting_down" and time.monotonic() - t0 < 1.0
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
                assert 1.8 < time.monotonic() - t0 < 5.0
        await asyncio.wrap_future(drained)
        assert in_flight(state) == 0 and state.admission.in_flight == 0
        assert len(engine.aborted) == 1 and engine.running == set()
        registry = state.metrics.registry
        assert registry.get_sample_value("omnivoice_requests_total", {"status": "cancelled"}) == 1
