"""Every route's auth over a real server with API keys (fake engine): 401 in OpenAI's shape without a
key or with a wrong one, the route's own answer with a key; the public routes; the official `openai`
SDK; the WebSocket by header and by the browsers' subprotocol; client secrets for the WebSocket and
WebRTC, charged to the key that minted them; dead and misplaced secrets."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest
import websockets

from omnivoice.config import parse_profile
from omnivoice.server import create_app
from omnivoice.server.auth.keys import key_id
from tests.support.fake_engine import FakeEngine, FakeServer
from tests.support.keys import KEY, OTHER_KEY, bearer, sdk, serve_keyed, ws_url
from tests.support.polling import until
from tests.support.webrtc_client import connect as webrtc_connect

CHAT = {"model": "omnivoice", "messages": [{"role": "user", "content": "hi"}]}

# (method, path, body, status with a key)
ROUTES = [
    ("POST", "/v1/chat/completions", CHAT, 200),
    ("GET", "/v1/models", None, 200),
    ("GET", "/v1/models/omnivoice", None, 200),
    ("GET", "/metrics", None, 200),
    ("POST", "/v1/realtime/client_secrets", {}, 200),
    ("POST", "/v1/realtime/calls", None, 400),  # no offer: the route's own 400, past auth
    ("POST", "/v1/realtime/calls/rtc_nope/hangup", None, 404),
    ("GET", "/v1/telephony/twilio/twiml", None, 200),
    ("GET", "/v1/no/such/route", None, 404),  # unknown paths need a key too: no route is open by mistake
]


@pytest.fixture(scope="module")
def srv() -> Iterator[FakeServer]:
    with serve_keyed() as s:
        yield s


def request(srv: FakeServer, method: str, path: str, body: dict | None, headers: dict) -> httpx.Response:
    return httpx.request(method, srv.url + path, json=body, headers=headers, timeout=10)


@pytest.mark.parametrize(("method", "path", "body", "status"), ROUTES)
def test_every_route_needs_a_key(
    srv: FakeServer, method: str, path: str, body: dict | None, status: int
) -> None:
    for headers in ({}, bearer("sk-wrong"), bearer(KEY + "x"), {"Authorization": KEY}):
        r = request(srv, method, path, body, headers)
        assert r.status_code == 401, (headers, r.text)
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["code"] == "invalid_api_key"
        assert KEY not in r.text and "sk-wrong" not in r.text
        assert r.headers["www-authenticate"].split()[0] in ("Bearer", "Basic")
    for key in (KEY, OTHER_KEY):
        assert request(srv, method, path, body, bearer(key)).status_code == status


@pytest.mark.parametrize("path", ["/health", "/", "/web/js/app.js", "/web/style.css"])
def test_the_page_and_health_are_public(srv: FakeServer, path: str) -> None:
    assert httpx.get(srv.url + path).status_code == 200


async def test_the_openai_sdk_with_and_without_the_key(srv: FakeServer) -> None:
    with pytest.raises(openai.AuthenticationError) as err:
        await sdk(srv.url, "sk-wrong").models.list()
    assert err.value.status_code == 401 and err.value.code == "invalid_api_key"
    client = sdk(srv.url, KEY)
    assert [m.id for m in (await client.models.list()).data] == ["omnivoice"]
    done = await client.chat.completions.create(
        model="omnivoice", messages=[{"role": "user", "content": "hi"}]
    )
    assert done.choices[0].message.content


async def test_the_sdks_realtime_client_with_and_without_the_key(srv: FakeServer) -> None:
    async with sdk(srv.url, KEY).realtime.connect(model="omnivoice") as conn:
        assert (await conn.recv()).type == "session.created"
    with pytest.raises(websockets.exceptions.InvalidStatus) as err:  # the handshake is refused
        async with sdk(srv.url, "sk-wrong").realtime.connect(model="omnivoice") as conn:
            await conn.recv()
    assert err.value.response.status_code == 401
    assert json.loads(err.value.response.body)["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize("how", ["header", "subprotocol"])
async def test_websocket_with_the_key(srv: FakeServer, how: str) -> None:
    if how == "header":
        ws_ctx = websockets.connect(ws_url(srv.url), additional_headers=bearer(KEY))
    else:  # what a browser can do: no headers on a WebSocket
        protocols = ["realtime", f"openai-insecure-api-key.{KEY}"]
        ws_ctx = websockets.connect(ws_url(srv.url), subprotocols=protocols)  # type: ignore[arg-type]
    async with ws_ctx as ws:
        assert ws.subprotocol == ("realtime" if how == "subprotocol" else None)
        assert json.loads(await ws.recv())["type"] == "session.created"


@pytest.mark.parametrize(
    "offer",
    [{}, {"subprotocols": ["realtime", "openai-insecure-api-key.sk-wrong"]}, {"headers": bearer("x")}],
)
async def test_websocket_without_a_valid_key_is_refused_before_the_handshake(
    srv: FakeServer, offer: dict
) -> None:
    # the sessions of the tests before (closed by their clients) are released by the server meanwhile
    await until(lambda: not srv.app.state.realtime.sessions, 10)
    with pytest.raises(websockets.exceptions.InvalidStatus) as err:
        async with websockets.connect(
            ws_url(srv.url), subprotocols=offer.get("subprotocols"), additional_headers=offer.get("headers")
        ):
            pass
    assert err.value.response.status_code == 401
    assert not srv.app.state.realtime.sessions


def mint(srv: FakeServer, key: str | None, **body: object) -> httpx.Response:
    headers = bearer(key) if key else {}
    return httpx.post(f"{srv.url}/v1/realtime/client_secrets", json=body, headers=headers)


async def test_client_secrets_open_websocket_sessions_and_are_charged_to_their_key(srv: FakeServer) -> None:
    assert mint(srv, None).status_code == 401
    value = mint(srv, OTHER_KEY, session={"instructions": "Be brief."}).json()["value"]
    assert srv.app.state.auth.secrets.get(value).owner == key_id(OTHER_KEY)
    protocols = ["realtime", f"openai-insecure-api-key.{value}"]
    async with websockets.connect(ws_url(srv.url), subprotocols=protocols) as ws:  # type: ignore[arg-type]
        created = json.loads(await ws.recv())
        assert created["session"]["instructions"] == "Be brief."
        assert srv.app.state.auth.limits.open_sessions() == {key_id(OTHER_KEY): 1}
    async with websockets.connect(ws_url(srv.url), additional_headers=bearer(value)) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"


async def test_client_secrets_open_webrtc_calls(srv: FakeServer) -> None:
    value = mint(srv, KEY, session={"instructions": "Hi."}).json()["value"]
    call = await webrtc_connect(srv.url, token=value)
    try:
        created = await call.next("session.created")
        assert created["session"]["instructions"] == "Hi."
        assert srv.app.state.auth.limits.open_sessions() == {key_id(KEY): 1}
        r = httpx.post(f"{srv.url}/v1/realtime/calls/{call.call_id}/hangup", headers=bearer(value))
        assert r.status_code == 200
    finally:
        await call.close()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models", "/v1/realtime/client_secrets"])
def test_a_client_secret_is_no_api_key(srv: FakeServer, path: str) -> None:
    value = mint(srv, KEY).json()["value"]
    r = httpx.post(srv.url + path, json=CHAT if "chat" in path else {}, headers=bearer(value))
    if path == "/v1/models":
        r = httpx.get(srv.url + path, headers=bearer(value))
    assert r.status_code == 401 and "API key" in r.json()["error"]["message"]


async def test_expired_and_unknown_secrets_are_refused(srv: FakeServer) -> None:
    expired = srv.app.state.auth.secrets.issue({}, ttl_s=-1, owner=key_id(KEY)).value
    for token in (expired, "ek_unknown"):
        with pytest.raises(websockets.exceptions.InvalidStatus) as err:
            async with websockets.connect(ws_url(srv.url), additional_headers=bearer(token)):
                pass
        assert err.value.response.status_code == 401
        r = httpx.post(
            f"{srv.url}/v1/realtime/calls",
            content="v=0\r\n",
            headers={"Content-Type": "application/sdp", **bearer(token)},
        )
        assert (
            r.status_code == 401
            and r.json()["error"]["message"] == "the client secret is invalid or has expired"
        )


def test_metrics_can_be_public() -> None:
    with serve_keyed(auth={"public_metrics": True}) as s:
        assert httpx.get(f"{s.url}/metrics").status_code == 200
        assert httpx.get(f"{s.url}/v1/models").status_code == 401


def test_the_keys_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNIVOICE_API_KEY", f"{KEY},{OTHER_KEY}")
    app = create_app(parse_profile({}), FakeEngine.factory())
    assert len(app.state.auth.keys) == 2 and app.state.auth.keys.match(OTHER_KEY) == key_id(OTHER_KEY)
