"""Who a Twilio media stream is charged to. The carrier cannot send our API key on the WebSocket, so
when the server has keys the stream's `start` must bring back the one-use token that the TwiML
webhook (which needed a key) put in its `<Parameter>`s; a stream without a live token is refused.

Until then the stream is unauthenticated and gets little: a few frames, `PREAUTH_BYTES` in all (a
larger frame is refused by the protocol from its header, see ws_guard; this count holds under any
server), and `START_TIMEOUT_S`. Once the token is redeemed the message limit is lifted.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from starlette.websockets import WebSocket

from omnivoice.server.auth.guard import Auth
from omnivoice.server.auth.keys import ANONYMOUS
from omnivoice.server.auth.stream_tokens import PARAMETER
from omnivoice.server.fleet.answers import redeem_elsewhere
from omnivoice.server.fleet.member import FleetMember
from omnivoice.server.session.ending import CLOSE_POLICY
from omnivoice.server.telephony import twilio_protocol as tw
from omnivoice.server.ws_guard import PREAUTH_BYTES, lift_message_limit

log = logging.getLogger(__name__)

START_TIMEOUT_S = 10.0  # Twilio sends `connected` then `start` at once
MAX_FRAMES_BEFORE_START = 8
CLOSE_TOO_BIG = 1009


@dataclass
class StreamAuth:
    owner: str | None  # the id of the key the call is charged to; None: refuse the stream
    frames: list[str | bytes] = field(default_factory=list)  # read to learn it, for the call to handle
    close_code: int = CLOSE_POLICY  # how to close a refused stream


async def stream_owner(websocket: WebSocket, auth: Auth, fleet: FleetMember | None = None) -> StreamAuth:
    """Read the stream's first frames until its `start` says who it is charged to. Without API keys
    every stream is anonymous and nothing is read. `fleet`: this is one front end of several, and a
    token minted by another is redeemed there."""
    if not auth.keys:
        lift_message_limit(websocket.scope)
        return StreamAuth(ANONYMOUS)
    found = await _read_start(websocket, auth, fleet)
    if found.owner is not None:
        lift_message_limit(websocket.scope)
    return found


async def _read_start(websocket: WebSocket, auth: Auth, fleet: FleetMember | None) -> StreamAuth:
    frames: list[str | bytes] = []
    size = 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + START_TIMEOUT_S
    while len(frames) < MAX_FRAMES_BEFORE_START:
        try:
            async with asyncio.timeout_at(deadline):
                message = await websocket.receive()
        except TimeoutError:
            log.warning("telephony stream refused: no start within %g s", START_TIMEOUT_S)
            return StreamAuth(None, frames)
        if message["type"] == "websocket.disconnect":
            return StreamAuth(None, frames)
        data = message.get("text")
        frame: str | bytes = data if data is not None else message.get("bytes") or b""
        size += len(frame.encode() if isinstance(frame, str) else frame)
        if size > PREAUTH_BYTES:
            log.warning("telephony stream refused: more than %d bytes before its start", PREAUTH_BYTES)
            return StreamAuth(None, close_code=CLOSE_TOO_BIG)
        frames.append(frame)
        try:
            event = tw.parse_event(frame)
        except tw.TwilioProtocolError:
            continue  # the call logs it when it handles the frames
        if isinstance(event, tw.Start):
            token = event.start.custom_parameters.get(PARAMETER, "")
            owner = auth.stream_tokens.redeem(token) or await redeem_elsewhere(fleet, token)
            if owner is None:
                log.warning("telephony stream %s refused: no live token from the TwiML", event.stream_sid)
            return StreamAuth(owner, frames)
    log.warning("telephony stream refused: no start in its first %d frames", MAX_FRAMES_BEFORE_START)
    return StreamAuth(None, frames)
