"""Admission from the engine's measured capacity, over a real server and the fake engine (which reports
the capacity a test sets): each open realtime session and each chat request with audio holds a
promised stream; one more than the capacity is refused with each protocol's answer, text-only chat is
not held to it, a session's own responses are within its promise, and refused work leaves nothing held.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
import websockets
from aiortc import RTCConfiguration, RTCPeerConnection

from omnivoice.config import parse_profile
from omnivoice.server import create_app
from tests.support.fake_engine import FakeEngine, FakeServer
from tests.support.polling import until
from tests.support.realtime_client import Recorder, client
from tests.support.serve import serve
from tests.support.twilio_carrier import call

AUDIO_CHAT: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}]}  # text and audio by default
TEXT_CHAT: dict[str, Any] = {**AUDIO_CHAT, "modalities": ["text"]}


@contextmanager
def serve_fake() -> Iterator[FakeServer]:
    engines: list[FakeEngine] = []
    app = create_app(parse_profile({}), FakeEngine.factory(engines=engines))
    with serve(app) as url:
        yield FakeServer(url, app, engines)


async def _webrtc_offer(url: str) -> httpx.Response:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("audio")
    await pc.setLocalDescription(await pc.createOffer())
    try:
        async with httpx.AsyncClient(timeout=10) as c:
            return await c.post(
                f"{url}/v1/realtime/calls",
                content=pc.localDescription.sdp,
                headers={"Content-Type": "application/sdp"},
            )
    finally:
        await pc.close()


async def _refused_everywhere(s: FakeServer, what: str) -> None:
    """A new stream is refused over every transport, each with its protocol's answer."""
    async with httpx.AsyncClient(base_url=s.url, timeout=10) as c:
        r = await c.post("/v1/chat/completions", json=AUDIO_CHAT)
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
        err = r.json()["error"]
        assert err["code"] == "server_overloaded" and err["type"] == "server_error" and what in err["message"]
        assert (await c.post("/v1/chat/completions", json=TEXT_CHAT)).status_code == 200  # no audio
    url = s.url.replace("http", "ws") + "/v1/realtime"
    async with websockets.connect(url) as refused:
        event = json.loads(await refused.recv())
        assert event["type"] == "error" and event["error"]["code"] == "server_overloaded", event
        await asyncio.wait_for(refused.wait_closed(), 5)
        assert refused.close_code == 1013
    r = await _webrtc_offer(s.url)
    assert r.status_code == 503 and r.json()["error"]["code"] == "server_overloaded", r.text
    with pytest.raises(websockets.ConnectionClosed) as exc:
        async with call(s.url) as phone:
            await phone.ws.recv()
    assert exc.value.rcvd is not None and exc.value.rcvd.code == 1013


async def test_streams_past_the_measured_capacity_are_refused_and_sessions_keep_their_promise() -> None:
    with serve_fake() as s:
        s.engine.streams = 1  # the engine measured room for one real-time stream
        async with client(s.url).realtime.connect(model="omnivoice") as conn:  # it takes that one
            rec = Recorder(conn)
            await rec.next("session.created")
            assert s.app.state.admission.streams == 1
            await _refused_everywhere(s, "measured capacity of 1")
            # the admitted session's responses speak within its promise
            item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
            await conn.conversation.item.create(item=item)  # type: ignore[arg-type]
            await conn.response.create()
            done = (await rec.next("response.done")).response
            assert done.status == "completed" and "response.output_audio.delta" in rec.types()
            await rec.close()
        await until(lambda: s.app.state.admission.streams == 0, 5, "the session's stream given back")
        async with httpx.AsyncClient(base_url=s.url, timeout=10) as c:  # room again
            assert (await c.post("/v1/chat/completions", json=AUDIO_CHAT)).status_code == 200
    assert s.app.state.admission.streams == 0 and s.app.state.admission.in_flight == 0


async def test_no_new_stream_while_an_admitted_one_runs_behind_real_time() -> None:
    with serve_fake() as s:
        s.engine.stalled = True  # capacity not measured yet, but a stream already runs behind
        async with client(s.url).realtime.connect(model="omnivoice") as conn:
            rec = Recorder(conn)
            await rec.next("session.created")  # with nothing promised, one stream is always admitted
            await _refused_everywhere(s, "behind real time")
            s.engine.stalled = False
            async with httpx.AsyncClient(base_url=s.url, timeout=10) as c:
                assert (await c.post("/v1/chat/completions", json=AUDIO_CHAT)).status_code == 200
            await rec.close()
        await until(lambda: s.app.state.realtime.reserved == 0, 5, "the session's slot given back")
        assert s.app.state.admission.streams == 0
