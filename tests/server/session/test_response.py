"""A response over the fake engine when the engine fails mid-stream: the failure reaches the client at
once, over the WebSocket and over WebRTC, instead of after the audio the engine had already made has
played out at real-time pace."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest

from tests.support.fake_engine import FakeServer, Script, serve_realtime
from tests.support.realtime_client import Recorder, client
from tests.support.webrtc_client import connect

# 6 s of audio made in a blink, then a failure: paced at 1 s ahead of playback, nearly all of that
# audio is still waiting to be sent when the failure arrives
FAILING = Script(texts=("Hi",), audio_chunks=60, chunk_samples=2400, delay=0.001, finish_reason="error")
MADE_MS = 6000
ITEM = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}


@pytest.fixture(scope="module")
def srv() -> Iterator[FakeServer]:
    with serve_realtime(FAILING, max_audio_ahead_ms=1000) as s:
        yield s


async def test_an_engine_failure_ends_a_websocket_response_before_its_queued_audio(srv: FakeServer) -> None:
    async with client(srv.url).realtime.connect(model="omnivoice") as conn:
        rec = Recorder(conn)
        await rec.next("session.created")
        await conn.conversation.item.create(item=ITEM)  # type: ignore[arg-type]
        await conn.response.create()
        done = (await rec.next("response.done", timeout=10)).response
        before_done = [e for _, e in rec.events[: rec._seen]]
        await rec.close()
    sent = [e for e in before_done if e.type == "response.output_audio.delta"]
    sent_ms = sum(len(base64.b64decode(e.delta)) for e in sent) / 2 / 24  # pcm16 at 24 kHz
    assert done.status == "failed", done.status_details
    assert done.status_details is not None and done.status_details.error is not None
    assert done.status_details.error.code == "engine_error"
    assert done.status_details.error.message == "boom"  # the engine's client-facing text
    assert sent_ms < MADE_MS / 2, sent_ms  # the rest was dropped, not played out first
    errors = [e.error for e in before_done if e.type == "error"]  # an error event before the done
    assert [(e.code, e.message) for e in errors] == [("engine_error", "boom")]


async def test_a_response_while_the_engine_restarts_is_refused_and_the_session_stays(
    srv: FakeServer,
) -> None:
    async with client(srv.url).realtime.connect(model="omnivoice") as conn:
        rec = Recorder(conn)
        await rec.next("session.created")
        srv.engine.failure, srv.engine.restarting = "the engine is restarting", True
        try:
            await conn.conversation.item.create(item=ITEM)  # type: ignore[arg-type]
            await conn.response.create()
            error = await rec.next("error", timeout=10)
            done = (await rec.next("response.done", timeout=10)).response
        finally:
            srv.engine.failure, srv.engine.restarting = None, False
        await conn.response.create()  # the same session, once the engine is back
        again = (await rec.next("response.done", timeout=10)).response
        await rec.close()
    assert error.error.code == "engine_restarting" and "the engine is restarting" in error.error.message
    assert done.status == "failed" and done.status_details is not None
    assert done.status_details.error is not None and done.status_details.error.code == "engine_restarting"
    assert again.id != done.id and again.status == "failed"  # the script's own engine error, this time
    assert again.status_details is not None and again.status_details.error is not None
    assert again.status_details.error.code == "engine_error"


async def test_an_engine_failure_ends_a_webrtc_response_before_its_queued_audio(srv: FakeServer) -> None:
    call = await connect(srv.url)
    try:
        sid = (await call.next("session.created"))["session"]["id"]
        session = srv.app.state.realtime.sessions[sid]
        call.send({"type": "conversation.item.create", "item": ITEM})
        call.send({"type": "response.create"})
        done = await call.next("response.done", timeout=10)
        ledger = session.last_response.item.ledger  # what went to the call's playout track
    finally:
        await call.close()
    assert done["response"]["status"] == "failed"
    assert done["response"]["status_details"]["error"]["code"] == "engine_error"
    assert 1000 * ledger.generated / 24000 < MADE_MS / 2, ledger.generated
