"""Twilio with API keys: the TwiML webhook needs the key (HTTP Basic, as Twilio sends a
`https://user:KEY@host/...` webhook's credentials, or Bearer) and hands the stream a one-use token;
a stream whose `start` lacks a live token is closed 1008 before any session opens."""

from __future__ import annotations

import asyncio
from xml.etree import ElementTree as ET

import httpx
import pytest

from omnivoice.server.auth.keys import key_id
from tests.support.keys import KEY, serve_keyed
from tests.support.polling import until
from tests.support.twilio_carrier import Carrier, call


def twiml(url: str, **kwargs: object) -> httpx.Response:
    return httpx.get(f"{url}/v1/telephony/twilio/twiml", params={"voice": "chelsie"}, **kwargs)  # type: ignore[arg-type]


def token_of(body: str) -> str:
    params = {p.get("name"): p.get("value") for p in ET.fromstring(body).iter("Parameter")}
    assert params["voice"] == "chelsie"
    return str(params["omnivoice_token"])


async def ended(carrier: Carrier) -> int | None:
    await asyncio.wait_for(carrier.closed.wait(), 15)
    return carrier.ws.close_code


def test_the_twiml_webhook_needs_the_key() -> None:
    with serve_keyed() as s:
        r = twiml(s.url)
        assert r.status_code == 401 and r.headers["www-authenticate"] == 'Basic realm="omnivoice"'
        assert twiml(s.url, auth=("twilio", "sk-wrong")).status_code == 401
        basic = twiml(s.url, auth=("twilio", KEY))
        bearer = twiml(s.url, headers={"Authorization": f"Bearer {KEY}"})
        assert basic.status_code == bearer.status_code == 200
        assert token_of(basic.text).startswith("tw_") and token_of(basic.text) != token_of(bearer.text)
        forged = httpx.get(
            f"{s.url}/v1/telephony/twilio/twiml", params={"voice": "chelsie", "omnivoice_token": "tw_mine"},
            auth=("twilio", KEY),
        )  # fmt: skip
        assert token_of(forged.text) != "tw_mine"  # a query parameter cannot choose the token


async def test_a_stream_with_the_twimls_token_is_served_once() -> None:
    with serve_keyed() as s:
        state = s.app.state
        token = token_of(twiml(s.url, auth=("twilio", KEY)).text)
        async with call(s.url) as carrier:
            await carrier.connected()
            await carrier.start(voice="chelsie", omnivoice_token=token)
            await until(lambda: state.realtime.sessions, 4, "the call's session opened")
            (session,) = state.realtime.sessions.values()
            assert session.settings.voice == "chelsie"
            assert state.auth.limits.open_sessions() == {key_id(KEY): 1}
            await carrier.stop()
            await ended(carrier)
        async with call(s.url) as again:  # the token was used up
            await again.connected()
            await again.start(omnivoice_token=token)
            assert await ended(again) == 1008


@pytest.mark.parametrize("token", [None, "tw_forged", "ek_x"])
async def test_a_stream_without_a_live_token_is_refused(token: str | None) -> None:
    with serve_keyed() as s:
        async with call(s.url) as carrier:
            await carrier.connected()
            await carrier.start(**({"omnivoice_token": token} if token else {}))
            assert await ended(carrier) == 1008
        assert not s.app.state.realtime.sessions and not s.app.state.auth.limits.open_sessions()
