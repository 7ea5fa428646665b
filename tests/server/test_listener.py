"""`omnivoice serve`'s uvicorn configuration: X-Forwarded-For is believed from server.trusted_proxies
only (uvicorn believes loopback by default), so rotating it cannot dodge the failed-auth limiter; and
WebSocket compression is off unless server.ws_per_message_deflate turns it on."""

from __future__ import annotations

import json

import httpx
import websockets

from tests.support.keys import KEY, bearer, serve_keyed, ws_url


def failed_attempts(url: str, n: int) -> list[int]:
    """The statuses of `n` wrong keys, each sent as from another address."""
    return [
        httpx.get(
            f"{url}/v1/models", headers={**bearer("sk-wrong"), "X-Forwarded-For": f"203.0.113.{i}"}
        ).status_code
        for i in range(n)
    ]


def test_forwarded_for_is_ignored_by_default() -> None:
    with serve_keyed(auth={"max_failed_auth_per_minute": 3}) as s:
        assert failed_attempts(s.url, 5) == [401, 401, 401, 429, 429]


def test_forwarded_for_is_believed_from_trusted_proxies() -> None:
    auth = {"max_failed_auth_per_minute": 3}
    with serve_keyed(auth=auth, server={"trusted_proxies": ["127.0.0.1"]}) as s:
        assert failed_attempts(s.url, 5) == [401] * 5  # five clients behind the proxy, one failure each


async def test_websocket_audio_is_not_deflated_unless_configured() -> None:
    """A client that offers permessage-deflate (websockets does by default) gets it only when
    server.ws_per_message_deflate is on."""
    for deflate in (False, True):
        with serve_keyed(server={"ws_per_message_deflate": deflate}) as s:
            url = ws_url(s.url) + "/v1/realtime"
            async with websockets.connect(url, additional_headers=bearer(KEY)) as ws:
                assert json.loads(await ws.recv())["type"] == "session.created"
                names = [type(e).__name__ for e in ws.protocol.extensions]
                assert names == (["PerMessageDeflate"] if deflate else []), (deflate, names)
