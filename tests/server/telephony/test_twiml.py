"""The TwiML helper route, and calls refused at the session limit (real server, fake engine)."""

from __future__ import annotations

from xml.etree import ElementTree as ET

import httpx
import pytest
import websockets

from omnivoice.config import parse_profile
from omnivoice.server import create_app
from tests.support.fake_engine import FakeEngine
from tests.support.polling import until
from tests.support.serve import serve
from tests.support.twilio_carrier import call


def stream_of(body: str) -> ET.Element:
    root = ET.fromstring(body)
    assert root.tag == "Response"
    (connect,) = root
    (stream,) = connect
    assert connect.tag == "Connect" and stream.tag == "Stream"
    return stream


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_twiml_points_the_call_at_the_stream_with_the_parameters(method: str) -> None:
    app = create_app(parse_profile({}), FakeEngine.factory())
    with serve(app) as url:
        params = {"voice": "chelsie", "instructions": 'Say "hi" & <be> brief.'}
        form = {"CallSid": "CA1", "From": "+15550100"} if method == "POST" else None
        r = httpx.request(method, f"{url}/v1/telephony/twilio/twiml", params=params, data=form)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/xml")
    assert r.text.startswith('<?xml version="1.0" encoding="UTF-8"?>')
    stream = stream_of(r.text)
    host = url.removeprefix("http://")
    assert stream.attrib == {"url": f"wss://{host}/v1/telephony/twilio"}
    assert [(p.tag, p.attrib) for p in stream] == [
        ("Parameter", {"name": "voice", "value": "chelsie"}),
        ("Parameter", {"name": "instructions", "value": 'Say "hi" & <be> brief.'}),
    ]


def test_twiml_uses_the_profiles_public_url() -> None:
    app = create_app(
        parse_profile({"telephony": {"public_url": "wss://voice.example.com"}}), FakeEngine.factory()
    )
    with serve(app) as url:
        r = httpx.get(f"{url}/v1/telephony/twilio/twiml")
    stream = stream_of(r.text)
    assert stream.attrib["url"] == "wss://voice.example.com/v1/telephony/twilio" and len(stream) == 0


async def test_a_call_over_the_session_limit_is_refused() -> None:
    app = create_app(parse_profile({"realtime": {"max_sessions": 1}}), FakeEngine.factory())
    with serve(app) as url:
        async with call(url) as first:
            await first.connected()
            with pytest.raises(websockets.ConnectionClosed) as exc:
                async with call(url) as second:
                    await second.ws.recv()
            assert exc.value.rcvd is not None and exc.value.rcvd.code == 1013
        # the server ends the call once it sees the close
        await until(lambda: not app.state.realtime.sessions, 5, "the first call ended")
        assert app.state.realtime.sessions == {}
