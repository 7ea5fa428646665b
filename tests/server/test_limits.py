"""Limits and admission over a real server and the fake engine: request bodies, capacity (503 at once,
never queued, without slowing what was admitted), realtime events, the input buffer, session slots
shared by every transport."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
import websockets
from aiortc import RTCConfiguration, RTCPeerConnection

from omnivoice.config import parse_profile
from omnivoice.server import create_app
from tests.support.fake_engine import FakeEngine, FakeServer, Script
from tests.support.polling import until
from tests.support.realtime_client import Recorder, client
from tests.support.serve import serve
from tests.support.speech import pcm16
from tests.support.twilio_carrier import call

USER: list[Any] = [{"role": "user", "content": "hi"}]
PTT = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
SLOW = Script(texts=("x",) * 30, audio_chunks=0, delay=0.02)  # ~0.6 s per request


@contextmanager
def serve_profile(script: Script | None = None, **sections: Any) -> Iterator[FakeServer]:
    engines: list[FakeEngine] = []
    app = create_app(parse_profile(sections), FakeEngine.factory(script, engines=engines))
    with serve(app) as url:
        yield FakeServer(url, app, engines)


async def test_a_chunked_body_over_the_limit_is_413() -> None:
    async def body() -> AsyncIterator[bytes]:  # no Content-Length: chunked transfer encoding
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(10):
            yield b"x" * 1024
        yield b'"}]}'

    with serve_profile(server={"max_body_bytes": 4096}) as s:
        async with httpx.AsyncClient(base_url=s.url, timeout=10) as c:
            r = await c.post(
                "/v1/chat/completions", content=body(), headers={"content-type": "application/json"}
            )
            assert "content-length" not in r.request.headers
            assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
            ok = await c.post("/v1/chat/completions", json={"messages": USER})
            assert ok.status_code == 200
        assert s.app.state.admission.in_flight == 0


@pytest.mark.parametrize("limit", ["admission", "engine"])
async def test_a_flood_over_capacity_is_refused_at_once_and_admitted_streams_finish(limit: str) -> None:
    server = {"max_concurrent_requests": 2 if limit == "admission" else 64}
    with serve_profile(SLOW, server=server) as s:
        if limit == "engine":
            s.engine.max_running = 2
        async with httpx.AsyncClient(base_url=s.url, timeout=20) as c:

            async def admitted() -> tuple[float, list[str]]:
                t0 = time.perf_counter()
                async with c.stream(
                    "POST", "/v1/chat/completions", json={"messages": USER, "stream": True}
                ) as r:
                    assert r.status_code == 200
                    lines = [line async for line in r.aiter_lines() if line]
                return time.perf_counter() - t0, lines

            async def refused(stream: bool) -> float:
                t0 = time.perf_counter()
                r = await c.post("/v1/chat/completions", json={"messages": USER, "stream": stream})
                assert r.status_code == 503, r.text
                assert r.headers["retry-after"] == "1"
                assert r.json()["error"]["code"] == "server_overloaded"
                return time.perf_counter() - t0

            running = [asyncio.create_task(admitted()) for _ in range(2)]
            await until(lambda: len(s.engine.running) >= 2, 10, "both admitted streams running")
            waits = await asyncio.gather(*(refused(i % 2 == 0) for i in range(40)))
            assert max(waits) < 10, waits  # answered at once, not queued until a slot frees
            for took, lines in await asyncio.gather(*running):
                assert lines[-1] == "data: [DONE]" and sum('"content":"x"' in x for x in lines) == 30
                assert took < 0.6 + 10  # the flood did not hold them up
    assert s.count("rejected") == 40 and s.count("ok") == 2
    assert not s.engine.aborted and s.app.state.admission.in_flight == 0


async def test_a_realtime_response_refused_at_once_gets_an_error_and_a_failed_response() -> None:
    with serve_profile(server={"max_concurrent_requests": 1}) as s:
        async with client(s.url).realtime.connect(model="omnivoice") as conn:
            rec = Recorder(conn)
            await rec.next("session.created")
            item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
            await conn.conversation.item.create(item=item)  # type: ignore[arg-type]
            await rec.next("conversation.item.added")
            s.engine.max_running = 0  # every stage full
            await conn.response.create()
            assert (await rec.next("response.created")).response.status == "in_progress"
            err = (await rec.next("error")).error
            assert err.code == "server_overloaded" and err.type == "server_error"
            done = (await rec.next("response.done")).response
            assert done.status == "failed" and done.status_details.error.code == "server_overloaded"
            assert done.output == [] and rec.types().count("conversation.item.added") == 1
            s.engine.max_running = None
            async with httpx.AsyncClient(base_url=s.url, timeout=10) as c:  # the one slot is taken
                body = {"messages": USER, "stream": True}
                slow = Script(texts=("x",) * 100, audio_chunks=0, delay=0.02)
                s.engine.script = slow
                async with c.stream("POST", "/v1/chat/completions", json=body) as r:
                    await anext(r.aiter_lines())
                    await conn.response.create()
                    err = (await rec.next("error")).error
                    assert err.code == "server_overloaded" and "concurrent requests" in err.message
                    assert (await rec.next("response.done")).response.status == "failed"
            await rec.close()


@pytest.mark.parametrize(
    "sections",
    [
        {"realtime": {"max_event_bytes": 4096, "max_buffer_seconds": 1.0}},
        # the server's audio limit caps the buffer too: a committed buffer is one audio part
        {"realtime": {"max_event_bytes": 4096}, "server": {"max_audio_seconds": 1.0}},
    ],
)
async def test_an_oversized_event_gets_an_error_and_the_session_goes_on(sections: dict) -> None:
    with serve_profile(**sections) as s:
        async with client(s.url).realtime.connect(model="omnivoice") as conn:
            rec = Recorder(conn)
            await rec.next("session.created")
            await conn.send_raw(
                json.dumps({"type": "session.update", "session": {"instructions": "x" * 5000}})
            )
            err = (await rec.next("error")).error
            assert err.code == "event_too_large" and "4096" in err.message
            await conn.session.update(session=PTT)
            await rec.next("session.updated")
            chunk = base64.b64encode(pcm16(0.03)).decode()  # 30 ms: ~2 KB of JSON
            for _ in range(33):  # 0.99 s fits in the 1 s buffer
                await conn.input_audio_buffer.append(audio=chunk)
            await conn.input_audio_buffer.append(audio=chunk)
            err = (await rec.next("error")).error
            assert err.code == "input_audio_buffer_full"
            await conn.input_audio_buffer.commit()
            assert (await rec.next("input_audio_buffer.committed")).item_id
            await rec.close()
        # the server ends the session once it sees the close: a moment after the client's side
        await until(lambda: not s.app.state.realtime.sessions, 5, "the session ended")
        assert s.app.state.realtime.sessions == {}


async def test_websocket_webrtc_and_phone_sessions_share_max_sessions() -> None:
    with serve_profile(realtime={"max_sessions": 1}) as s:
        async with client(s.url).realtime.connect(model="omnivoice") as conn:
            rec = Recorder(conn)
            await rec.next("session.created")
            pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
            pc.addTransceiver("audio")
            await pc.setLocalDescription(await pc.createOffer())
            r = httpx.post(
                f"{s.url}/v1/realtime/calls",
                content=pc.localDescription.sdp,
                headers={"Content-Type": "application/sdp"},
            )
            await pc.close()
            assert r.status_code == 503 and r.json()["error"]["code"] == "session_limit_reached"
            assert r.headers["retry-after"] == "1"
            with pytest.raises(websockets.ConnectionClosed) as exc:
                async with call(s.url) as phone:
                    await phone.ws.recv()
            assert exc.value.rcvd is not None and exc.value.rcvd.code == 1013
            await rec.close()
        async with client(s.url).realtime.connect(model="omnivoice") as conn:  # the slot came back
            rec = Recorder(conn)
            await rec.next("session.created")
            await rec.close()
