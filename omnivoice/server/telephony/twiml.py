"""`GET|POST /v1/telephony/twilio/twiml`: the TwiML that connects a phone call to this server.

Point a Twilio number's voice webhook at `https://HOST/v1/telephony/twilio/twiml?voice=chelsie&
instructions=...`: the answer is `<Connect><Stream url="wss://HOST/v1/telephony/twilio">` with every
query parameter passed on as a `<Parameter>` (the stream's `customParameters`). The stream's host is
`telephony.public_url` when the profile sets it, else the Host the webhook request was sent to.
"""

from __future__ import annotations

from collections.abc import Mapping
from xml.etree import ElementTree as ET

from starlette.requests import Request
from starlette.responses import Response

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
    url = stream_url(request, request.app.state.profile.telephony.public_url)
    return Response(twiml_document(url, request.query_params), media_type="text/xml")
