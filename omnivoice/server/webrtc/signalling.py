"""WebRTC signalling, as OpenAI's Realtime WebRTC: `POST /v1/realtime/calls` takes the SDP offer
(`Content-Type: application/sdp`; aiortc-style JSON `{sdp, type: "offer"}` also works) and answers
201 with the SDP answer and `Location: /v1/realtime/calls/{call_id}`. `POST
/v1/realtime/calls/{call_id}/hangup` ends the call. A client secret (`Authorization: Bearer ek_...`)
opens the session with the settings it was issued with; the call counts against the API key behind
the request (auth.rate_limit.max_sessions) until it ends.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from omnivoice.server.auth.principal import principal_of
from omnivoice.server.errors import (
    APIError,
    bad_request,
    not_found,
    payload_too_large,
    rate_limited,
    server_overloaded,
    service_unavailable,
)
from omnivoice.server.fleet.answers import hang_up_elsewhere
from omnivoice.server.session import protocol as p
from omnivoice.server.session.registry import SessionRefused
from omnivoice.server.webrtc.calls import Calls
from omnivoice.server.webrtc.peer import Call

log = logging.getLogger(__name__)

MAX_OFFER_BYTES = 64 * 1024


async def create_call(request: Request) -> Response:
    state = request.app.state
    principal = principal_of(request)  # authenticated by the auth middleware
    settings = principal.secret.session if principal.secret else None
    offer = await _read_offer(request)
    call, answer = await _open(state.webrtc, principal.owner, offer, settings)
    location = f"/v1/realtime/calls/{call.id}"
    return Response(answer, status_code=201, media_type="application/sdp", headers={"Location": location})


async def _open(calls: Calls, owner: str, offer: str, settings: dict[str, Any] | None) -> tuple[Call, str]:
    try:
        return await calls.open(owner, offer, settings)
    except SessionRefused as e:
        raise _refusal(e) from None
    except p.ProtocolError as e:
        raise bad_request(e.message, param=e.param, code=e.code) from None
    except (ValueError, AssertionError) as e:  # aiortc rejects malformed or unsupported offers so
        log.info("rejected an SDP offer: %r", e)
        raise bad_request(f"the SDP offer was rejected: {e}", param="sdp", code="invalid_offer") from None
    except RuntimeError as e:  # shutting down
        raise APIError(503, str(e), type="server_error", code="service_unavailable") from None


def _refusal(e: SessionRefused) -> APIError:
    """The HTTP error for a call the server will not open now."""
    if e.kind == "rate_limited":  # the key's limits
        return rate_limited(e.message, e.retry_after_s)
    if e.kind == "session_limit":  # capacity, like chat's server_overloaded: 503, retry shortly
        return APIError(
            503, e.message, type="server_error", code="session_limit_reached", headers={"Retry-After": "1"}
        )
    if e.kind == "capacity":  # the engine could not serve its audio in real time, like chat's
        return server_overloaded(e.message)
    return service_unavailable(e.message)


async def hang_up(request: Request) -> Response:
    call_id = request.path_params["call_id"]
    state = request.app.state
    if not state.webrtc.hang_up(call_id) and not await hang_up_elsewhere(state.fleet, call_id):
        raise not_found(f"no call {call_id!r}", param="call_id", code="call_not_found")
    return JSONResponse({})


async def _read_offer(request: Request) -> str:
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_OFFER_BYTES:
            raise payload_too_large(MAX_OFFER_BYTES)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise bad_request("the SDP offer is not UTF-8", param="sdp", code="invalid_offer") from None
    if ctype == "application/json":
        try:
            data = json.loads(text)
            if data.get("type", "offer") != "offer":
                raise ValueError("type must be 'offer'")
            text = data["sdp"]
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:  # [[[[... is too deep
            raise bad_request(f"expected {{sdp, type: 'offer'}}: {e}", code="invalid_offer") from None
    elif ctype != "application/sdp":
        raise bad_request(f"Content-Type must be application/sdp, got {ctype!r}", code="invalid_content_type")
    if not isinstance(text, str) or not text.startswith("v=0"):
        raise bad_request("the body is not an SDP offer", param="sdp", code="invalid_offer")
    if "m=audio" not in text:
        raise bad_request("the offer has no audio (m=audio) section", param="sdp", code="invalid_offer")
    return text
