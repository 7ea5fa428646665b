"""Who a Twilio media stream is charged to. The carrier cannot send our API key on the WebSocket, so
when the server has keys the stream's `start` must bring back the one-use token that the TwiML
webhook (which needed a key) put in its `<Parameter>`s; a stream without a live token is refused.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.websockets import WebSocket

from omnivoice.server.auth.guard import Auth
from omnivoice.server.auth.keys import ANONYMOUS
from omnivoice.server.auth.stream_tokens import PARAMETER
from omnivoice.server.telephony import twilio_protocol as tw

log = logging.getLogger(__name__)

START_TIMEOUT_S = 10.0  # Twilio sends `connected` then `start` at once
MAX_FRAMES_BEFORE_START = 8


async def stream_owner(websocket: WebSocket, auth: Auth) -> tuple[str | None, list[str | bytes]]:
    """The id of the API key the stream is charged to (None: refuse it), and the frames read to
    learn it, for the call to handle. Without API keys every stream is anonymous and nothing is read."""
    if not auth.keys:
        return ANONYMOUS, []
    frames: list[str | bytes] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + START_TIMEOUT_S
    while len(frames) < MAX_FRAMES_BEFORE_START:
        try:
            message = await asyncio.wait_for(websocket.receive(), timeout=max(deadline - loop.time(), 0.001))
        except TimeoutError:
            log.warning("telephony stream refused: no start within %g s", START_TIMEOUT_S)
            return None, frames
        if message["type"] == "websocket.disconnect":
            return None, frames
        data = message.get("text")
        frame: str | bytes = data if data is not None else message.get("bytes") or b""
        frames.append(frame)
        try:
            event = tw.parse_event(frame)
        except tw.TwilioProtocolError:
            continue  # the call logs it when it handles the frames
        if isinstance(event, tw.Start):
            owner = auth.stream_tokens.redeem(event.start.custom_parameters.get(PARAMETER, ""))
            if owner is None:
                log.warning("telephony stream %s refused: no live token from the TwiML", event.stream_sid)
            return owner, frames
    log.warning("telephony stream refused: no start in its first %d frames", MAX_FRAMES_BEFORE_START)
    return None, frames
