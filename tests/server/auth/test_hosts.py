"""DNS rebinding: a page on an attacker's domain that resolves to 127.0.0.1 sends its own name as both
Host and Origin. A server without keys answers only the Hosts it serves (localhost, IP addresses,
auth.allowed_hosts) and gives others 421; with keys, such a page is never "same origin". Each test
sends the forged Host and Origin to a real server, over HTTP and over the WebSocket."""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import httpx
import pytest
import websockets

from omnivoice.server.auth.origins import HostPolicy
from tests.support.keys import KEY, bearer, serve_keyed

CHAT = {"model": "omnivoice", "messages": [{"role": "user", "content": "hi"}]}


def rebound(url: str, name: str = "rebind.attacker.example") -> tuple[str, str]:
    """The Host and Origin a page at http://NAME:PORT sends once NAME resolves to this server."""
    port = urlsplit(url).port
    return f"{name}:{port}", f"http://{name}:{port}"


async def ws_status(url: str, host: str, origin: str | None, headers: dict[str, str]) -> int:
    """The HTTP status of a realtime WebSocket handshake sent to `url`'s socket as `host` (101: open)."""
    port = urlsplit(url).port
    uri = f"ws://{host}/v1/realtime?model=omnivoice"
    kwargs = {"host": "127.0.0.1", "port": port, "origin": origin, "proxy": None}
    try:
        async with websockets.connect(uri, additional_headers=headers, **kwargs) as ws:  # type: ignore[arg-type]
            assert json.loads(await ws.recv())["type"] == "session.created"
            return 101
    except websockets.exceptions.InvalidStatus as e:
        return e.response.status_code


@pytest.mark.parametrize(
    ("host", "served"),
    [
        ("127.0.0.1:8000", True),
        ("localhost:8000", True),
        ("LOCALHOST", True),
        ("[::1]:8000", True),
        ("10.1.2.3:8000", True),
        ("voice.example.com", True),  # in allowed_hosts
        ("app.example.com:443", True),  # an allowed origin's host
        ("rebind.attacker.example:8000", False),
        ("localhost.attacker.example", False),
        ("evil@127.0.0.1:8000", False),
        ("127.0.0.1:8000/x", False),
        ("", False),
    ],
)
def test_host_policy(host: str, served: bool) -> None:
    policy = HostPolicy(["voice.example.com"], ["https://app.example.com"], own=["127.0.0.1"])
    assert policy.serves(host) is served
    assert HostPolicy(["*"]).serves(host)


def test_the_servers_own_names_are_served() -> None:
    assert HostPolicy([], own=["gpu-box.lan"]).serves("gpu-box.lan:8000")
    assert not HostPolicy([], own=["0.0.0.0", ""]).serves("gpu-box.lan:8000")


async def test_a_rebound_page_cannot_drive_an_open_server() -> None:
    with serve_keyed(keys=()) as s:
        host, origin = rebound(s.url)
        for headers in ({"Host": host, "Origin": origin}, {"Host": host}):  # GETs carry no Origin
            r = httpx.get(f"{s.url}/v1/debug/state", headers=headers)
            assert r.status_code == 421, r.text
            assert r.json()["error"]["code"] == "host_not_allowed"
            assert httpx.post(f"{s.url}/v1/chat/completions", json=CHAT, headers=headers).status_code == 421
        assert await ws_status(s.url, host, origin, {}) == 421
        assert not s.engines[0].requests

        # the server's own names still work, the page included
        port = urlsplit(s.url).port
        for own in (f"127.0.0.1:{port}", f"localhost:{port}"):
            headers = {"Host": own, "Origin": f"http://{own}"}
            assert httpx.get(f"{s.url}/v1/debug/state", headers=headers).status_code == 200
            assert await ws_status(s.url, own, f"http://{own}", {}) == 101


@pytest.mark.parametrize(
    ("name", "sections"),
    [
        ("voice.lan", {"auth": {"allowed_hosts": ["voice.lan"]}}),
        ("voice.example.net", {"telephony": {"public_url": "wss://voice.example.net"}}),
    ],
)
async def test_the_profiles_hosts_are_served_without_a_key(name: str, sections: dict) -> None:
    with serve_keyed(keys=(), **sections) as s:
        host, origin = rebound(s.url, name)
        r = httpx.post(f"{s.url}/v1/chat/completions", json=CHAT, headers={"Host": host, "Origin": origin})
        assert r.status_code == 200, r.text
        assert await ws_status(s.url, host, origin, {}) == 101


async def test_a_rebound_page_is_not_same_origin_on_a_keyed_server() -> None:
    with serve_keyed() as s:
        host, origin = rebound(s.url)
        r = httpx.get(f"{s.url}/v1/models", headers={"Host": host, "Origin": origin, **bearer(KEY)})
        assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
        assert "auth.allowed_hosts" in r.json()["error"]["message"]
        assert await ws_status(s.url, host, origin, bearer(KEY)) == 403
        # programs (no Origin) are protected by their key, whatever Host they name
        assert httpx.get(f"{s.url}/v1/models", headers={"Host": host, **bearer(KEY)}).status_code == 200
        assert httpx.get(f"{s.url}/v1/models", headers={"Host": host}).status_code == 401
        # the page on the server's own address is same-origin as before
        assert await ws_status(s.url, urlsplit(s.url).netloc, s.url, bearer(KEY)) == 101
