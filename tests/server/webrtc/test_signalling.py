"""`POST /v1/realtime/calls` and hang-up over a real server and the fake engine: bad offers, the
aiortc-style JSON offer, the session limit, and calls closed at shutdown."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection

from tests.support.fake_engine import FakeServer, serve_realtime
from tests.support.polling import until
from tests.support.webrtc_client import connect


@pytest.fixture(scope="module")
def srv() -> Iterator[FakeServer]:
    with serve_realtime(max_sessions=1) as s:
        yield s


@pytest.fixture
async def offer() -> AsyncIterator[str]:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("audio")
    pc.createDataChannel("oai-events")
    await pc.setLocalDescription(await pc.createOffer())
    yield pc.localDescription.sdp
    await pc.close()


def post(srv: FakeServer, body: str | bytes, ctype: str = "application/sdp") -> httpx.Response:
    return httpx.post(f"{srv.url}/v1/realtime/calls", content=body, headers={"Content-Type": ctype})


def released(srv: FakeServer) -> bool:
    state = srv.app.state
    return not state.webrtc.calls and not state.realtime.sessions and not state.realtime.reserved


@pytest.mark.parametrize(
    ("body", "ctype", "code"),
    [
        ("v=0\r\n", "text/plain", "invalid_content_type"),
        ("hello", "application/sdp", "invalid_offer"),
        ("v=0\r\nm=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\n", "application/sdp", "invalid_offer"),
        ('{"type": "answer", "sdp": "v=0"}', "application/json", "invalid_offer"),
        (b"v=0\xff\xfe", "application/sdp", "invalid_offer"),
    ],
)
def test_bad_offers_get_400(srv: FakeServer, body: str | bytes, ctype: str, code: str) -> None:
    r = post(srv, body, ctype)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == code


async def test_a_malformed_audio_offer_is_refused_and_releases_its_slot(srv: FakeServer) -> None:
    r = post(srv, "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n")
    assert r.status_code == 400 and r.json()["error"]["param"] == "sdp"
    await until(lambda: released(srv), 10, "the call released")


async def test_json_offer_session_limit_and_hang_up(srv: FakeServer, offer: str) -> None:
    r = post(srv, json.dumps({"type": "offer", "sdp": offer}), "application/json")
    assert r.status_code == 201, r.text
    assert r.text.startswith("v=0") and "a=setup:active" in r.text
    location = r.headers["location"]
    assert location.startswith("/v1/realtime/calls/rtc_")
    busy = post(srv, offer)  # max_sessions=1
    assert busy.status_code == 503 and busy.json()["error"]["code"] == "session_limit_reached"
    assert busy.headers["retry-after"] == "1"
    assert httpx.post(f"{srv.url}{location}/hangup").status_code == 200
    await until(lambda: released(srv), 10, "the call released")
    assert httpx.post(f"{srv.url}/v1/realtime/calls/rtc_nope/hangup").status_code == 404


async def test_shutdown_closes_calls() -> None:
    with serve_realtime() as s:
        call = await connect(s.url)
        await call.next("session.created")
        state = s.app.state
        assert len(state.webrtc.calls) == 1
    try:  # the server has stopped
        assert not state.webrtc.calls and not state.realtime.sessions and not state.realtime.reserved
        assert s.engine.forgotten  # the session was closed (its prefix-cache entry freed)
    finally:
        await call.close()
