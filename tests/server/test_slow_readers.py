"""Clients that stop reading, over real sockets and the tiny model: a raw WebSocket (realtime) and a raw
SSE stream with a tiny receive buffer that never read. Each is dropped once its bounded buffers fill
(realtime.max_outbox_bytes, server.send_timeout_s), its engine request is aborted (the engine's request
tables go back to zero), and a well-behaved session running at the same time gets its audio on time.

To fill the buffers in a second or two instead of tens, the server's listening socket gets a small
SO_SNDBUF (accepted sockets inherit it; Linux would otherwise absorb a few MB per connection)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.polling import until
from tests.support.realtime_client import Recorder, client
from tests.support.requests import streamed_audio_chat
from tests.support.serve import ServerThread, serve_tiny

FRAMES = 60  # codec frames of the well-behaved response: 4.8 s of audio
HOG_FRAMES = 900  # the slow reader's response: 72 s of audio, far more than any buffer holds


@pytest.fixture(scope="module")
def st(tiny_checkpoint: Path) -> Iterator[ServerThread]:
    server = {"send_timeout_s": 2.0}
    # no pacing, to fill fast; the outbox then takes a whole vocoder chunk (2 s: ~128 KB) at once
    realtime = {"max_outbox_bytes": 512 * 1024, "max_audio_ahead_ms": 600_000}
    with serve_tiny(tiny_checkpoint, server=server, realtime=realtime) as st:
        for sock in st.server.servers[0].sockets:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 * 1024)
        yield st


def stalled_socket(st: ServerThread) -> socket.socket:
    """A TCP connection to the server with a tiny receive buffer, which the test never reads."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", int(st.base_url.rsplit(":", 1)[1])))
    return s


def ws_handshake(s: socket.socket, path: str) -> None:
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:  # byte by byte: leave the first frames in the socket
        head += s.recv(1)
    assert b" 101 " in head.split(b"\r\n")[0], head


def ws_send(s: socket.socket, event: dict[str, Any]) -> None:
    payload, mask = json.dumps(event).encode(), os.urandom(4)
    n = len(payload)
    length = bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + n.to_bytes(2, "big")
    s.sendall(b"\x81" + length + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))


def read_to_eof(s: socket.socket, timeout: float) -> int:
    """Read everything the server had queued; returns the bytes read before the connection closed."""
    s.settimeout(timeout)
    total = 0
    while chunk := s.recv(65536):
        total += len(chunk)
    return total


def session_update(frames: int) -> dict[str, Any]:
    return {
        "type": "session.update",
        "session": {
            "type": "realtime",
            "audio": {"input": {"turn_detection": None}},
            "omnivoice": {"min_output_tokens": 8, "output_audio_frames": frames},
        },
    }


USER_ITEM = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}


async def normal_response(url: str) -> tuple[float, int]:
    """A well-behaved session's response: (seconds from response.create to response.done, audio bytes)."""
    async with client(url).realtime.connect(model="omnivoice") as conn:
        rec = Recorder(conn)
        await rec.next("session.created")
        await conn.send_raw(json.dumps(session_update(FRAMES)))
        await rec.next("session.updated")
        await conn.conversation.item.create(item=USER_ITEM)  # type: ignore[arg-type]
        await rec.next("conversation.item.done")
        t0 = time.monotonic()
        await conn.response.create()
        done = await rec.next("response.done", timeout=120)
        took = time.monotonic() - t0
        assert done.response.status in ("completed", "incomplete"), done.response.status_details
        audio = len(rec.audio(done.response.id))
        await rec.close()
    return took, audio


async def test_a_realtime_client_that_stops_reading_is_dropped_without_slowing_others(
    st: ServerThread, caplog: pytest.LogCaptureFixture
) -> None:
    state = st.server.config.app.state  # type: ignore[attr-defined]
    engine = state.lifecycle.engine
    alone, audio_alone = await normal_response(st.base_url)
    assert audio_alone > 0
    await until(lambda: state.realtime.sessions == {}, 5, "the first session ended")

    hog = stalled_socket(st)
    ws_handshake(hog, "/v1/realtime?model=omnivoice")
    await until(lambda: len(state.realtime.sessions) == 1, 10, "the slow session opened")
    (sid,) = state.realtime.sessions
    for event in (session_update(HOG_FRAMES), {"type": "conversation.item.create", "item": USER_ITEM}):
        ws_send(hog, event)
    ws_send(hog, {"type": "response.create"})
    await until(lambda: engine.stats().active_requests == 1, 10, "the slow session's response runs")

    took, audio = await normal_response(st.base_url)  # meanwhile the slow one fills its buffers
    assert audio == audio_alone
    assert took < 2 * alone + 2.0, (took, alone)

    await until(lambda: sid not in state.realtime.sessions, 30, "the slow client was dropped")
    # the engine's abort and the slot's release are two steps of the server's loop; wait for both
    await until(
        lambda: engine.stats().active_requests == 0 and state.admission.in_flight == 0,
        10,
        "its request was aborted and its slot released",
    )
    assert engine.replica_load() == [[0], [0], [0]]
    assert any("stopped reading" in r.getMessage() and sid in r.getMessage() for r in caplog.records)
    # what the server had queued drains once the client reads again, then the connection is closed
    got = await asyncio.to_thread(read_to_eof, hog, 20)
    hog.close()
    assert 0 < got < 8 * 1024 * 1024  # far less than the 120 s of audio the response would have sent


async def test_an_sse_reader_that_stalls_is_dropped_and_its_request_aborted(st: ServerThread) -> None:
    state = st.server.config.app.state  # type: ignore[attr-defined]
    engine = state.lifecycle.engine
    cancelled = state.metrics.registry.get_sample_value("omnivoice_requests_total", {"status": "cancelled"})
    body = json.dumps(streamed_audio_chat(HOG_FRAMES)).encode()
    hog = stalled_socket(st)
    hog.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await until(lambda: engine.stats().active_requests == 1, 10, "the stream started")
    _, audio = await normal_response(st.base_url)
    assert audio > 0
    t0 = time.monotonic()
    # the response aborts the engine request first, then releases its slot (on_close)
    await until(
        lambda: engine.stats().active_requests == 0 and state.admission.in_flight == 0,
        30,
        "the stalled stream's request aborted and its slot released",
    )
    assert time.monotonic() - t0 < 30
    assert engine.replica_load() == [[0], [0], [0]]
    after = state.metrics.registry.get_sample_value("omnivoice_requests_total", {"status": "cancelled"})
    assert after == cancelled + 1
    got = await asyncio.to_thread(read_to_eof, hog, 20)
    hog.close()
    assert 0 < got < 8 * 1024 * 1024
