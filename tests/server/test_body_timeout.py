"""A request body must arrive within server.body_timeout_s of its headers (408 `request_timeout`, and
the connection closes), on a real server; a client that leaves mid-body is an INFO line, not an error."""

from __future__ import annotations

import json
import logging
import socket
import time
from urllib.parse import urlsplit

import pytest

from tests.support.keys import KEY, serve_keyed
from tests.support.polling import wait_until

HEAD = (
    "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    f"Authorization: Bearer {KEY}\r\nContent-Length: 1000\r\n\r\n"
).encode()


def read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_a_slow_body_gets_408() -> None:
    with serve_keyed(server={"body_timeout_s": 0.5}) as s:
        sock = socket.create_connection(("127.0.0.1", urlsplit(s.url).port), timeout=10)
        sock.sendall(HEAD + b'{"model": ')  # 1000 bytes announced, a few sent
        reply = read_all(sock)  # the server answers and closes: no hang
        assert reply.startswith(b"HTTP/1.1 408"), reply
        assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"
        assert not s.engines[0].requests


def test_a_client_leaving_mid_body_is_no_error(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    with serve_keyed() as s:
        sock = socket.create_connection(("127.0.0.1", urlsplit(s.url).port), timeout=10)
        sock.sendall(HEAD + b'{"model": ')
        time.sleep(0.2)  # the route is reading the body
        sock.close()
        wait_until(lambda: "disconnected before its body" in caplog.text, 10, "the INFO line")
    assert "disconnected before its body" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
