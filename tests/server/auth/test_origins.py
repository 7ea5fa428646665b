"""Browser origins: the server's own page passes, other origins get 403 unless allowed
(`auth.allowed_origins`), allowed ones get CORS (preflight and headers); programs send no Origin."""

from __future__ import annotations

import json

import httpx
import pytest
import websockets

from omnivoice.server.auth.origins import OriginPolicy, same_origin
from tests.support.keys import KEY, bearer, serve_keyed, ws_url

APP = "https://app.example.com"
EVIL = "https://evil.example.net"


@pytest.mark.parametrize(
    ("origin", "host", "same"),
    [
        ("http://127.0.0.1:8000", "127.0.0.1:8000", True),
        ("https://voice.example.com", "voice.example.com", True),
        ("https://voice.example.com", "voice.example.com:443", True),
        ("http://Voice.Example.com", "voice.example.com", True),
        ("http://[::1]:8000", "[::1]:8000", True),
        ("http://127.0.0.1:8001", "127.0.0.1:8000", False),
        ("https://voice.example.com", "voice.example.com:80", False),
        ("http://voice.example.com.evil.net", "voice.example.com", False),
        ("null", "127.0.0.1:8000", False),
        ("file://", "127.0.0.1:8000", False),
    ],
)
def test_same_origin(origin: str, host: str, same: bool) -> None:
    assert same_origin(origin, host) is same


def test_policy_verdicts() -> None:
    policy = OriginPolicy([APP])
    assert policy.verdict(None, "h:1") == "none"
    assert policy.verdict("http://h:1", "h:1") == "same"
    assert policy.verdict(APP, "h:1") == "cross" and policy.verdict(APP + "/", "h:1") == "cross"
    assert policy.verdict(EVIL, "h:1") == "denied"
    assert OriginPolicy(["*"]).verdict(EVIL, "h:1") == "cross"


def test_origins_over_http_and_websocket() -> None:
    with serve_keyed(auth={"allowed_origins": [APP]}) as s:
        own = s.url  # http://127.0.0.1:PORT, the page's own origin
        for origin, status in ((own, 200), (APP, 200), (EVIL, 403)):
            r = httpx.get(f"{s.url}/v1/models", headers={**bearer(KEY), "Origin": origin})
            assert r.status_code == status, (origin, r.text)
            assert ("access-control-allow-origin" in r.headers) is (origin == APP)
        r = httpx.get(f"{s.url}/v1/models", headers={**bearer(KEY), "Origin": EVIL})
        assert r.json()["error"]["code"] == "origin_not_allowed"
        assert httpx.get(f"{s.url}/", headers={"Origin": EVIL}).status_code == 403

        # an allowed page elsewhere can read the answers, errors included
        r = httpx.post(f"{s.url}/v1/realtime/client_secrets", json={}, headers={"Origin": APP})
        assert r.status_code == 401 and r.headers["access-control-allow-origin"] == APP
        r = httpx.get(f"{s.url}/v1/models", headers={**bearer(KEY), "Origin": APP})
        assert "X-Request-Id" in r.headers["access-control-expose-headers"]

        asked = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
        pre = httpx.options(f"{s.url}/v1/realtime/calls", headers={"Origin": APP, **asked})
        assert pre.status_code == 204
        assert pre.headers["access-control-allow-origin"] == APP
        assert "POST" in pre.headers["access-control-allow-methods"]
        assert pre.headers["access-control-allow-headers"] == "authorization"
        assert (
            httpx.options(f"{s.url}/v1/realtime/calls", headers={"Origin": EVIL, **asked}).status_code == 403
        )


@pytest.mark.parametrize("keyed", [True, False])
async def test_websocket_origins(keyed: bool) -> None:
    keys = (KEY,) if keyed else ()  # without keys the origin check still protects a loopback server
    with serve_keyed(keys) as s:
        headers = bearer(KEY) if keyed else {}
        async with websockets.connect(ws_url(s.url), additional_headers=headers, origin=s.url) as ws:  # type: ignore[arg-type]
            assert json.loads(await ws.recv())["type"] == "session.created"
        with pytest.raises(websockets.exceptions.InvalidStatus) as err:
            async with websockets.connect(ws_url(s.url), additional_headers=headers, origin=EVIL):  # type: ignore[arg-type]
                pass
        assert err.value.response.status_code == 403
