"""Keys never reach the logs: a whole run with keys presented everywhere (right and wrong, in every
place a client may put them) logs none of them, and the filter that `run_server` installs masks a key
whoever logs it (uvicorn logs WebSocket paths with their query strings)."""

from __future__ import annotations

import asyncio
import json
import logging
import sys

import httpx
import pytest
import websockets

from omnivoice.config import Profile
from omnivoice.server.app import run_server
from omnivoice.server.auth.keys import ApiKeys
from omnivoice.server.auth.redact import RedactSecrets, redact_logs
from tests.support.keys import KEY, OTHER_KEY, bearer, serve_keyed, ws_url
from tests.support.twilio_carrier import call

WRONG = "sk-wrong-but-still-a-secret-0042"


def test_the_filter_masks_keys_and_tokens() -> None:
    f = RedactSecrets([KEY, "short"])
    assert f.redact(f"GET /v1/realtime?api_key={KEY}&x=1") == "GET /v1/realtime?api_key=***&x=1"
    assert f.redact("ek_AbCdEfGhIjKlMnOp and tw_0123456789_-ab") == "ek_*** and tw_***"
    assert (
        f.redact("nothing here: ek_ alone, sk-x, basic settings")
        == "nothing here: ek_ alone, sk-x, basic settings"
    )
    # credentials the server does not know (a wrong key, another service's) are masked too
    assert f.redact("< authorization: Bearer sk-typo") == "< authorization: Bearer ***"
    assert f.redact("< Authorization: Basic dHdpbGlvOnNr") == "< Authorization: Basic ***"
    assert f.redact("< sec-websocket-protocol: realtime, openai-insecure-api-key.sk-z") == (
        "< sec-websocket-protocol: realtime, openai-insecure-api-key.***"
    )
    assert f.redact("GET /x?model=m&api_key=sk-q&token=t") == "GET /x?model=m&api_key=***&token=***"
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "key %s in %s", (KEY, "args"), None)
    assert f.filter(record) and record.getMessage() == "key *** in args"


def test_the_filter_masks_keys_in_tracebacks() -> None:
    f = RedactSecrets([KEY])
    try:
        raise ValueError(f"bad header: Bearer {WRONG}, key {KEY}")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    record.stack_info = f"Stack (most recent call last):\n  token = '{KEY}'"
    assert f.filter(record)
    text = logging.Formatter().format(record)
    assert "ValueError: bad header: Bearer ***, key ***" in text and "token = '***'" in text
    assert KEY not in text and WRONG not in text


def test_run_server_masks_the_keys_in_every_log_handler(caplog: pytest.LogCaptureFixture) -> None:
    async def broken(profile: Profile) -> object:
        raise RuntimeError("no weights here")

    with caplog.at_level(logging.INFO):
        rc = asyncio.run(run_server(Profile(), "127.0.0.1", 0, "warning", broken, api_keys=ApiKeys([KEY])))
        logging.getLogger("uvicorn.error").warning('127.0.0.1:5 - "WebSocket /v1/realtime?k=%s" 403', KEY)
    assert rc == 1 and "API-key auth on: 1 key(s)" in caplog.text
    assert KEY not in caplog.text and "/v1/realtime?k=***" in caplog.text


def test_run_server_says_when_there_is_no_key(caplog: pytest.LogCaptureFixture) -> None:
    async def broken(profile: Profile) -> object:
        raise RuntimeError("no weights here")

    with caplog.at_level(logging.INFO):
        asyncio.run(run_server(Profile(), "127.0.0.1", 0, "warning", broken, api_keys=ApiKeys()))
    assert "no API key configured: listening on loopback only" in caplog.text


CLIENT_LOGGERS = ("httpx", "httpcore", "websockets.client")  # the test's own clients


@pytest.mark.parametrize("filtered", [False, True])
async def test_a_run_with_keys_logs_none_of_them(filtered: bool, caplog: pytest.LogCaptureFixture) -> None:
    """Without the filter, nothing of ours logs a credential; with it (as `run_server` installs it),
    nothing at all does, uvicorn's debug dump of the handshake's headers included."""
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="uvicorn.error")  # (uvicorn.Config may have set it higher)
    if filtered:
        redact_logs([KEY, OTHER_KEY])
    seen: list[str] = [KEY, OTHER_KEY, WRONG]
    with serve_keyed(auth={"rate_limit": {"max_sessions": 1}}) as s:
        for headers in ({}, bearer(KEY), bearer(WRONG), {"Authorization": f"Basic {KEY}"}):
            httpx.get(f"{s.url}/v1/models", headers=headers)
            httpx.post(f"{s.url}/v1/chat/completions", content=b"{", headers=headers)
            httpx.get(f"{s.url}/v1/telephony/twilio/twiml", headers=headers)
        httpx.get(f"{s.url}/v1/models", params={"api_key": KEY})  # a key where none belongs
        httpx.get(f"{s.url}/v1/telephony/twilio/twiml", auth=("twilio", WRONG))
        secret = httpx.post(f"{s.url}/v1/realtime/client_secrets", json={}, headers=bearer(KEY)).json()[
            "value"
        ]
        seen.append(secret)
        for token in (KEY, WRONG, secret):
            for offer in ({"additional_headers": bearer(token)},
                          {"subprotocols": ["realtime", f"openai-insecure-api-key.{token}"]}):  # fmt: skip
                try:
                    async with websockets.connect(ws_url(s.url), **offer) as ws:  # type: ignore[arg-type]
                        json.loads(await ws.recv())
                except websockets.exceptions.InvalidStatus:
                    pass
        twiml = httpx.get(f"{s.url}/v1/telephony/twilio/twiml", auth=("twilio", KEY)).text
        token = twiml.split('name="omnivoice_token" value="')[1].split('"')[0]
        seen.append(token)
        for _ in range(2):  # the second use is refused
            async with call(s.url) as carrier:
                await carrier.connected()
                await carrier.start(omnivoice_token=token)
                await carrier.stop()
    ours = [r for r in caplog.records if r.name.startswith("omnivoice" if not filtered else "")]
    text = "\n".join(r.getMessage() for r in ours if not r.name.startswith(CLIENT_LOGGERS))
    assert "refused" in text and "session" in text  # the run did log
    if filtered:
        assert "authorization: Bearer ***" in text  # uvicorn's debug dump of the handshake, masked
    for value in seen:
        assert value not in text
