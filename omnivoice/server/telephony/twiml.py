"""`GET|POST /v1/telephony/twilio/twiml`: the TwiML that connects a phone call to this server.

Point a Twilio number's voice webhook at `https://HOST/v1/telephony/twilio/twiml?voice=chelsie&
instructions=...`: the answer is `<Connect><Stream url="wss://HOST/v1/telephony/twilio">` with every
query parameter passed on as a `<Parameter>` (the stream's `customParameters`). The stream's host is
`telephony.public_url` when the profile sets it, else the Host the webhook request was sent to.

When the server has API keys, the webhook needs one (Twilio sends the password of a
`https://twilio:KEY@HOST/...` webhook URL as HTTP Basic auth), and the TwiML adds a one-use stream
token as the `<Parameter>` `omnivoice_token`, which the stream's `start` must bring back
(omnivoice/server/auth/stream_tokens.py); Twilio cannot send our key on the stream's WebSocket.
"""

from __future__ import annotations

from collections.abc import Mapping
from xml.etree import ElementTree as ET

from starlette.requests import Request
from starlette.responses import Response

from omnivoice.server.auth.principal import principal_of
from omnivoice.server.auth.stream_tokens import PARAMETER

STREAM_PATH = "/v1/telephony/twilio"
_XML_DECLARATION = '<?xml version="1.0" encoding="UTF-8"?>\n'


def stream_url(request: Request, public_url: str | None) -> str:
    """The WebSocket URL the carrier should open."""
    if public_url:
        return public_url.rstrip("/") + STREAM_PATH
    host = request.headers.get("x-forwarded-host") or request.headers.get("host") or request.url.netloc
    return f"wss://{host.split(',')[0].strip()}{STREAM_PATH}"  # Twilio opens wss:// only


def twiml_document(url: str, parameters: Mapping[str, str]) -> str:
    """`<Response><Connect><Stream url=...><Parameter name value/>...` (attribute values escaped)."""
    response = ET.Element("Response")
    stream = ET.SubElement(ET.SubElement(response, "Connect"), "Stream", url=url)
    for name, value in parameters.items():
        ET.SubElement(stream, "Parameter", name=name, value=value)
    ET.indent(response)
    return _XML_DECLARATION + ET.tostring(response, encoding="unicode") + "\n"


async def twilio_twiml(request: Request) -> Response:
    state = request.app.state
    url = stream_url(request, state.profile.telephony.public_url)
    parameters = {k: v for k, v in request.query_params.items() if k != PARAMETER}
    if state.auth.keys:
        parameters[PARAMETER] = state.auth.stream_tokens.issue(principal_of(request).owner)
    headers = {"Cache-Control": "no-store"}  # the token is for one stream
    return Response(twiml_document(url, parameters), media_type="text/xml", headers=headers)
