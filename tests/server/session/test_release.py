"""A realtime session (WebSocket, phone call or WebRTC call) is freed by reference counting as soon as
its connection ends, however it ends.

Nothing of it (its audio, resamplers, the socket's compressor) may wait for the cyclic garbage
collector: in a server that holds a model, full collections are rare, and the garbage of hundreds of
sessions piled up in between grew the server's heap for good (issue 6). So these tests run with the
cyclic collector off and expect the session object gone once its connection has ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import weakref
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import websockets

from tests.support.fake_engine import FakeServer, Script, serve_realtime
from tests.support.polling import until
from tests.support.twilio_carrier import call
from tests.support.webrtc_client import connect

USER_TEXT = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello"}]}


@pytest.fixture(scope="module")
def srv() -> Iterator[FakeServer]:
    with serve_realtime(Script(audio_chunks=40, delay=0.02)) as s:  # answers stream for ~1 s
        yield s


@pytest.fixture
def no_cyclic_gc(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    # INFO records are kept until the test ends (pytest captures them): whatever a log call passes as
    # an argument must not be the session or its call, or the check below could never pass
    caplog.set_level(logging.INFO)
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def _next(ws: Any, kind: str) -> dict[str, Any]:
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), 10))
        if event["type"] == kind:
            return event


async def _released(srv: FakeServer, *refs: weakref.ref[Any]) -> bool:
    with contextlib.suppress(AssertionError):  # the caller says what is still held
        await until(lambda: all(r() is None for r in refs), 10, "the session freed")
    return all(r() is None for r in refs) and not srv.app.state.realtime.sessions


ENDINGS = ["abrupt disconnect mid-answer", "close mid-answer", "close after answers"]


@pytest.mark.parametrize("ending", ENDINGS)
async def test_a_session_is_freed_without_the_cyclic_gc(
    srv: FakeServer, no_cyclic_gc: None, ending: str
) -> None:
    url = srv.url.replace("http", "ws") + "/v1/realtime?model=omnivoice"
    ws = await websockets.connect(url)
    created = await _next(ws, "session.created")
    session = srv.app.state.realtime.sessions[created["session"]["id"]]
    refs = weakref.ref(session), weakref.ref(session.outbox)  # the outbox holds the socket
    del session
    for _ in range(2 if ending == "close after answers" else 1):
        await ws.send(json.dumps({"type": "conversation.item.create", "item": USER_TEXT}))
        await ws.send(json.dumps({"type": "response.create"}))
        await _next(ws, "response.output_audio.delta")
        if ending == "close after answers":
            await _next(ws, "response.done")
    if ending == "abrupt disconnect mid-answer":
        ws.transport.abort()  # no close frame: the server's writer fails on its next send
    else:
        await ws.close()
    assert await _released(srv, *refs), [gc.get_referrers(r()) for r in refs if r() is not None]


@pytest.mark.parametrize("ending", ["stop", "abrupt disconnect"])
async def test_a_phone_call_is_freed_without_the_cyclic_gc(
    srv: FakeServer, no_cyclic_gc: None, ending: str
) -> None:
    async with call(srv.url) as carrier:
        await carrier.connected()
        await carrier.start()
        await until(lambda: srv.app.state.realtime.sessions, 10, "the call's session opened")
        (session,) = srv.app.state.realtime.sessions.values()
        refs = weakref.ref(session), weakref.ref(session.outbox)
        del session
        if ending == "stop":
            await carrier.stop()
        else:
            carrier.ws.transport.abort()
    assert await _released(srv, *refs), [gc.get_referrers(r()) for r in refs if r() is not None]


@pytest.mark.parametrize("ending", ["hang-up", "the client closes"])
async def test_a_webrtc_call_is_freed_without_the_cyclic_gc(
    srv: FakeServer, no_cyclic_gc: None, ending: str
) -> None:
    client = await connect(srv.url)
    try:
        await client.next("session.created")
        (session,) = srv.app.state.realtime.sessions.values()
        refs = weakref.ref(session), weakref.ref(session.outbox)  # the outbox holds the playout track
        del session
        if ending == "hang-up":
            async with httpx.AsyncClient() as http:
                await http.post(f"{srv.url}/v1/realtime/calls/{client.call_id}/hangup")
    finally:
        await client.close()
    assert await _released(srv, *refs), [gc.get_referrers(r()) for r in refs if r() is not None]
