"""Client secrets: `POST /v1/realtime/client_secrets`, and `ek_` tokens on the WebSocket (bearer header
or the browser's subprotocol), over a real server and the fake engine; the store's expiry."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest
import websockets

from omnivoice.server.auth.client_secrets import ClientSecrets, presented_token
from tests.support.fake_engine import FakeServer, serve_realtime


@pytest.fixture(scope="module")
def srv() -> Iterator[FakeServer]:
    with serve_realtime() as s:
        yield s


def issue(srv: FakeServer, body: dict) -> httpx.Response:
    return httpx.post(f"{srv.url}/v1/realtime/client_secrets", json=body)


def ws_url(srv: FakeServer) -> str:
    return srv.url.replace("http://", "ws://") + "/v1/realtime?model=omnivoice"


def test_issue_in_openai_shape(srv: FakeServer) -> None:
    session = {"type": "realtime", "instructions": "Be brief.", "audio": {"output": {"voice": "chelsie"}}}
    r = issue(srv, {"expires_after": {"anchor": "created_at", "seconds": 120}, "session": session})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["value"].startswith("ek_") and len(body["value"]) > 20
    assert abs(body["expires_at"] - (time.time() + 120)) < 5
    assert body["session"]["type"] == "realtime" and body["session"]["instructions"] == "Be brief."
    assert body["session"]["audio"]["output"]["voice"] == "chelsie"
    assert issue(srv, {}).json()["expires_at"] - time.time() > 590  # OpenAI's default: 10 minutes


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"expires_after": {"seconds": 5}}, "expires_after.seconds"),
        ({"session": {"audio": {"output": {"voice": "nobody"}}}}, "session.audio.output.voice"),
        ({"session": {"bogus": 1}}, "session.bogus"),
        ({"extra": 1}, "extra"),
    ],
)
def test_bad_requests_are_refused(srv: FakeServer, body: dict, param: str) -> None:
    r = issue(srv, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


async def test_websocket_with_a_secret_in_the_header_gets_its_settings(srv: FakeServer) -> None:
    value = issue(srv, {"session": {"instructions": "Be brief.", "max_output_tokens": 7}}).json()["value"]
    headers = {"Authorization": f"Bearer {value}"}
    async with websockets.connect(ws_url(srv), additional_headers=headers) as ws:
        created = json.loads(await ws.recv())
    assert created["type"] == "session.created"
    assert created["session"]["instructions"] == "Be brief." and created["session"]["max_output_tokens"] == 7


async def test_websocket_with_a_secret_in_the_subprotocol(srv: FakeServer) -> None:
    value = issue(srv, {"session": {"instructions": "Hi."}}).json()["value"]
    protocols = ["realtime", f"openai-insecure-api-key.{value}"]
    async with websockets.connect(ws_url(srv), subprotocols=protocols) as ws:  # type: ignore[arg-type]
        assert ws.subprotocol == "realtime"
        created = json.loads(await ws.recv())
    assert created["session"]["instructions"] == "Hi."


@pytest.mark.parametrize("token", ["ek_unknown", "expired"])
async def test_dead_secrets_are_refused_with_401(srv: FakeServer, token: str) -> None:
    if token == "expired":
        store = srv.app.state.auth.secrets
        token = store.issue({}, ttl_s=-1).value
    with pytest.raises(websockets.exceptions.InvalidStatus) as err:
        async with websockets.connect(ws_url(srv), additional_headers={"Authorization": f"Bearer {token}"}):
            pass
    assert err.value.response.status_code == 401
    r = httpx.post(
        f"{srv.url}/v1/realtime/calls",
        content="v=0\r\n",
        headers={"Content-Type": "application/sdp", "Authorization": f"Bearer {token}"},
    )
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


async def test_without_api_keys_any_other_bearer_token_passes(srv: FakeServer) -> None:
    """A server with no key is open (on loopback only); tests/server/auth covers servers with keys."""
    async with websockets.connect(ws_url(srv), additional_headers={"Authorization": "Bearer sk-x"}) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"


def test_store_expiry() -> None:
    now = [1000.0]
    store = ClientSecrets(clock=lambda: now[0])
    a = store.issue({"instructions": "a"}, ttl_s=60)
    assert store.get(a.value) == a and a.expires_at == 1060
    now[0] = 1060.0
    assert store.get(a.value) is None and len(store) == 0
    b = store.issue({}, ttl_s=10)
    store.issue({}, ttl_s=100)
    now[0] = 1080.0
    store.issue({}, ttl_s=10)  # issuing forgets the expired
    assert len(store) == 2 and store.get(b.value) is None


def test_presented_token() -> None:
    assert presented_token({"authorization": "Bearer ek_1"}) == "ek_1"
    assert presented_token({}, ["realtime", "openai-insecure-api-key.ek_2"]) == "ek_2"
    assert presented_token({"authorization": "Basic x"}, ["realtime"]) is None
