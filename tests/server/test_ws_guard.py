"""WebSockets before authentication get a small message allowance: a frame over it is refused from its
header, before the server reads its payload (close 1009), the Twilio stream counts what it reads
before its `start` under any server, and an authenticated connection may send large messages. A
refused handshake, or a text message that is not UTF-8, is logged as INFO, never as an ERROR."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import socket
import struct
from urllib.parse import urlsplit

import pytest
import websockets

from omnivoice.config import parse_profile
from omnivoice.server import create_app
from omnivoice.server.auth.keys import ApiKeys
from omnivoice.server.ws_guard import PREAUTH_BYTES
from tests.support.fake_engine import FakeEngine
from tests.support.keys import KEY, bearer, serve_keyed, ws_url
from tests.support.serve import serve
from tests.support.twilio_carrier import call

TWILIO = "/v1/telephony/twilio"


def open_raw_websocket(url: str, path: str) -> socket.socket:
    """A WebSocket opened by hand on a plain socket, so that a test can send half a frame."""
    port = urlsplit(url).port
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def frame_head(length: int) -> bytes:
    """A masked text frame's header announcing `length` bytes (mask 0: the payload goes as is)."""
    return struct.pack("!BBQ", 0x81, 0x80 | 127, length) + b"\0\0\0\0"


def test_a_large_frame_before_auth_is_refused_from_its_header() -> None:
    with serve_keyed() as s:
        sock = open_raw_websocket(s.url, TWILIO)
        announced = 8 * 1024 * 1024
        sock.sendall(frame_head(announced) + b"x" * 4096)  # and never the rest
        reply = sock.recv(64)  # a server waiting for the rest would time out here
        assert reply[:1] == b"\x88", reply  # a close frame...
        assert struct.unpack("!H", reply[2:4])[0] == 1009  # ...message too big
        sock.close()


async def test_the_twilio_stream_reads_little_before_its_start_under_any_server() -> None:
    profile = parse_profile({})
    app = create_app(profile, FakeEngine.factory(), api_keys=ApiKeys([KEY]))
    with serve(app) as url:  # a plain uvicorn: only the stream's own count protects it
        async with call(url) as carrier:
            await carrier.connected()
            await carrier.ws.send(json.dumps({"event": "media", "pad": "x" * PREAUTH_BYTES}))
            await asyncio.wait_for(carrier.closed.wait(), 10)
            assert carrier.ws.close_code == 1009
        assert not app.state.realtime.sessions


async def test_authenticated_websockets_may_send_large_messages() -> None:
    with serve_keyed() as s:
        async with websockets.connect(ws_url(s.url), additional_headers=bearer(KEY)) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
            silence = base64.b64encode(bytes(4 * PREAUTH_BYTES)).decode()
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": silence}))
            await ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
            events = [json.loads(await asyncio.wait_for(ws.recv(), 10))["type"]]
            while events[-1] != "input_audio_buffer.cleared":  # the connection stayed open
                events.append(json.loads(await asyncio.wait_for(ws.recv(), 10))["type"])
            assert "error" not in events, events


@pytest.mark.parametrize("keyed", [True, False])
async def test_refused_handshakes_are_not_errors(keyed: bool, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    with serve_keyed(keys=(KEY,) if keyed else ()) as s:
        port = urlsplit(s.url).port
        attempts = [
            {"origin": "https://evil.example"},  # 403
            {"uri": f"ws://rebind.example:{port}/v1/realtime", "host": "127.0.0.1", "port": port},
        ]
        if keyed:
            attempts.append({"additional_headers": bearer("sk-wrong")})  # 401
        for attempt in attempts:
            uri = attempt.pop("uri", ws_url(s.url))
            with pytest.raises(websockets.exceptions.InvalidStatus):
                async with websockets.connect(uri, proxy=None, **attempt):  # type: ignore[arg-type]
                    pass
        await asyncio.sleep(0.2)  # uvicorn logs after the app returns
    assert "refused" in caplog.text
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors


def test_text_that_is_not_utf8_closes_1007_without_an_error(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    with serve_keyed() as s:
        sock = open_raw_websocket(s.url, TWILIO)  # unauthenticated, like anyone
        sock.sendall(struct.pack("!BB", 0x81, 0x80 | 2) + b"\0\0\0\0" + b"\xff\xfe")
        reply = sock.recv(64)
        assert reply[:1] == b"\x88" and struct.unpack("!H", reply[2:4])[0] == 1007
        sock.close()
    assert "not UTF-8" in caplog.text
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
