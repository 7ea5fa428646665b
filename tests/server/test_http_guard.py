"""Slow and greedy clients at the connection, on a real server listening as `omnivoice serve` does: a
request's headers must arrive within server.header_timeout_s (408 if some came, else the connection
just closes), also on a kept-alive connection, but not once a request or a WebSocket is under way;
one address may hold server.max_connections_per_client connections, trusted proxies excepted."""

from __future__ import annotations

import asyncio
import json
import socket
from urllib.parse import urlsplit

import httpx
import websockets

from omnivoice.server.http_guard import ClientConnections
from tests.support.keys import serve_keyed, ws_url


def connect(url: str) -> socket.socket:
    return socket.create_connection(("127.0.0.1", urlsplit(url).port), timeout=10)


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (the socket's timeout fails a server that does not)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_slow_headers_get_408() -> None:
    with serve_keyed(keys=(), server={"header_timeout_s": 0.5}) as s:
        sock = connect(s.url)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")  # and nothing more
        reply = read_all(sock)
        assert reply.startswith(b"HTTP/1.1 408"), reply
        assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"

        assert read_all(connect(s.url)) == b""  # a connection that never sends anything is closed

        sock = connect(s.url)  # kept alive after a response: the next request's headers are timed too
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        first = b""
        while not first.endswith(b"}"):
            first += sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        assert read_all(sock).startswith(b"HTTP/1.1 408")


async def test_requests_and_websockets_under_way_are_not_timed() -> None:
    with serve_keyed(keys=(), server={"header_timeout_s": 0.3}) as s:
        async with websockets.connect(ws_url(s.url)) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
            await asyncio.sleep(1.0)
            await ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
            assert json.loads(await ws.recv())["type"] == "input_audio_buffer.cleared"
        chat = {"model": "omnivoice", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        with httpx.stream("POST", f"{s.url}/v1/chat/completions", json=chat, timeout=10) as r:
            assert r.status_code == 200
            assert "[DONE]" in r.read().decode()


def test_connections_per_client_are_capped() -> None:
    with serve_keyed(keys=(), server={"max_connections_per_client": 3}) as s:
        held = [connect(s.url) for _ in range(3)]
        extra = connect(s.url)
        assert read_all(extra) == b""  # closed at once
        held.pop().close()
        assert httpx.get(f"{s.url}/health").status_code == 200  # a slot is free again
        for sock in held:
            sock.close()


def test_trusted_proxies_are_not_capped() -> None:
    server = {"max_connections_per_client": 2, "trusted_proxies": ["127.0.0.0/8"]}
    with serve_keyed(keys=(), server=server) as s:
        held = [connect(s.url) for _ in range(4)]
        assert httpx.get(f"{s.url}/health").status_code == 200
        for sock in held:
            sock.close()


class Transport:
    def __init__(self) -> None:
        self.closed = False

    def is_closing(self) -> bool:
        return self.closed


def test_the_cap_counts_an_ipv6_client_by_its_64_and_frees_closed_connections() -> None:
    table = ClientConnections(2, exempt=["10.0.0.0/8"])
    first, second = Transport(), Transport()
    assert table.admit("2001:db8::1", first) and table.admit("2001:db8::ffff:2", second)  # type: ignore[arg-type]
    assert not table.admit("2001:db8::3", Transport())  # type: ignore[arg-type]  # the same /64
    assert table.admit("2001:db8:0:1::1", Transport())  # type: ignore[arg-type]  # another /64
    first.closed = True
    assert table.admit("2001:db8::3", Transport())  # type: ignore[arg-type]
    assert all(table.admit("10.1.2.3", Transport()) for _ in range(5))  # type: ignore[arg-type]
