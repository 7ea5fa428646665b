"""Per-key limits: the token bucket and the session cap, alone (a fake clock) and over a real server:
429 with Retry-After over HTTP (the SDK's RateLimitError), a Realtime `error` event and close 1013 on
the WebSocket, 429 for WebRTC; client secrets count against the key that minted them."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
import websockets

from omnivoice.config import RateLimitConfig
from omnivoice.server.auth.failures import AuthFailures
from omnivoice.server.auth.keys import key_id
from omnivoice.server.auth.limits import KeyLimits, RateLimited
from tests.support.keys import KEY, OTHER_KEY, bearer, sdk, serve_keyed, ws_url
from tests.support.polling import until
from tests.support.webrtc_client import connect as webrtc_connect


def test_token_bucket() -> None:
    now = [0.0]
    limits = KeyLimits(RateLimitConfig(requests_per_minute=60, burst=3), clock=lambda: now[0])
    for _ in range(3):
        limits.take("a")
    with pytest.raises(RateLimited) as err:
        limits.take("a")
    assert err.value.retry_after_s == 1 and "60 requests per minute" in err.value.message
    limits.take("b")  # every key has its own bucket
    now[0] = 1.0  # one request per second comes back
    limits.take("a")
    with pytest.raises(RateLimited):
        limits.take("a")
    now[0] = 100.0  # never more than the burst
    for _ in range(3):
        limits.take("a")
    with pytest.raises(RateLimited):
        limits.take("a")


def test_no_limits_by_default() -> None:
    limits = KeyLimits(RateLimitConfig())
    for _ in range(1000):
        limits.take("a")
    leases = [limits.claim_session("a") for _ in range(100)]
    assert limits.open_sessions() == {"a": 100}
    for lease in leases:
        lease.release()
        lease.release()  # idempotent
    assert limits.open_sessions() == {}


def test_session_cap() -> None:
    limits = KeyLimits(RateLimitConfig(max_sessions=2))
    first, _ = limits.claim_session("a"), limits.claim_session("a")
    with pytest.raises(RateLimited, match="2 realtime sessions"):
        limits.claim_session("a")
    limits.claim_session("b")
    first.release()
    limits.claim_session("a")


async def test_http_requests_over_the_rate_get_429() -> None:
    with serve_keyed(auth={"rate_limit": {"requests_per_minute": 2}}) as s:
        for _ in range(2):
            assert httpx.get(f"{s.url}/v1/models", headers=bearer(KEY)).status_code == 200
        r = httpx.get(f"{s.url}/v1/models", headers=bearer(KEY))
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"] == {
            "message": "rate limit of 2 requests per minute reached for this API key",
            "type": "rate_limit_error", "param": None, "code": "rate_limit_exceeded",
        }  # fmt: skip
        with pytest.raises(openai.RateLimitError):
            await sdk(s.url, KEY).models.list()
        assert httpx.get(f"{s.url}/v1/models", headers=bearer(OTHER_KEY)).status_code == 200
        assert httpx.get(f"{s.url}/health").status_code == 200  # public routes are not counted
        # a WebSocket over the rate reads why, then the socket closes 1013 (try again later)
        async with websockets.connect(ws_url(s.url), additional_headers=bearer(KEY)) as ws:
            event = json.loads(await ws.recv())
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await ws.recv()
        assert event["type"] == "error" and event["error"]["code"] == "rate_limit_exceeded"
        assert event["error"]["type"] == "rate_limit_error"
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013


async def test_sessions_over_the_keys_cap_get_a_realtime_error() -> None:
    with serve_keyed(auth={"rate_limit": {"max_sessions": 1}}) as s:
        secret = httpx.post(f"{s.url}/v1/realtime/client_secrets", json={}, headers=bearer(KEY)).json()[
            "value"
        ]
        async with sdk(s.url, KEY).realtime.connect(model="omnivoice") as first:
            assert (await first.recv()).type == "session.created"
            for token in (KEY, secret):  # the secret counts against the key that minted it
                async with websockets.connect(ws_url(s.url), additional_headers=bearer(token)) as ws:
                    event = json.loads(await ws.recv())
                    assert event["type"] == "error" and event["error"]["code"] == "rate_limit_exceeded"
                    with pytest.raises(websockets.ConnectionClosed) as closed:
                        await ws.recv()
                    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
            r = httpx.post(
                f"{s.url}/v1/realtime/calls",
                content="v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n",
                headers={"Content-Type": "application/sdp", **bearer(secret)},
            )
            assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
            assert "retry-after" in r.headers
            async with sdk(s.url, OTHER_KEY).realtime.connect(model="omnivoice") as other:
                assert (await other.recv()).type == "session.created"
            await until(lambda: s.app.state.auth.limits.open_sessions().get(key_id(KEY)) == 1)
        # the first session ended: its key may open another (here a WebRTC call)
        await until(lambda: not s.app.state.auth.limits.open_sessions())
        call = await webrtc_connect(s.url, token=secret)
        try:
            await call.next("session.created")
        finally:
            await call.close()


def test_failed_attempts_per_address() -> None:
    now = [0.0]
    failures = AuthFailures(per_minute=3, clock=lambda: now[0])
    failures.check("10.0.0.1")  # nothing counted yet
    for _ in range(3):
        failures.failed("10.0.0.1")
    with pytest.raises(RateLimited, match="too many failed authentication attempts") as err:
        failures.check("10.0.0.1")
    assert err.value.retry_after_s == 20  # one attempt back every 20 s
    failures.check("10.0.0.2")  # other addresses are not affected
    now[0] = 20.0
    failures.check("10.0.0.1")
    failures.failed("10.0.0.1")
    with pytest.raises(RateLimited):
        failures.check("10.0.0.1")
    unlimited = AuthFailures(per_minute=None)
    for _ in range(100):
        unlimited.failed("10.0.0.1")
    unlimited.check("10.0.0.1")
    assert len(unlimited) == 0


def test_failed_attempts_table_is_bounded() -> None:
    now = [0.0]
    failures = AuthFailures(per_minute=2, clock=lambda: now[0], max_addresses=100)
    for i in range(1000):
        failures.failed(f"10.0.{i // 256}.{i % 256}")
    assert len(failures) == 100  # the oldest were forgotten
    failures.failed("10.9.9.9")
    failures.failed("10.9.9.9")
    with pytest.raises(RateLimited):
        failures.check("10.9.9.9")  # the newest is still throttled
    now[0] = 600.0  # every bucket refilled: a new address evicts those first
    failures.failed("10.8.8.8")
    assert len(failures) == 1


async def test_an_address_guessing_keys_gets_429_then_even_a_right_key_waits() -> None:
    with serve_keyed(auth={"max_failed_auth_per_minute": 3}) as s:
        for _ in range(3):
            r = httpx.get(f"{s.url}/v1/models", headers=bearer("sk-wrong-guess"))
            assert r.status_code == 401
        r = httpx.get(f"{s.url}/v1/models", headers=bearer(KEY))
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["code"] == "rate_limit_exceeded"
        assert "failed authentication" in r.json()["error"]["message"]
        assert httpx.get(f"{s.url}/health").status_code == 200  # public routes stay open
        with pytest.raises(websockets.InvalidStatus) as refused:  # the WebSocket too
            async with websockets.connect(ws_url(s.url), additional_headers=bearer(KEY)):
                pass
        assert refused.value.response.status_code == 429
