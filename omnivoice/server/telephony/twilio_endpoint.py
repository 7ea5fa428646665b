"""`WebSocket /v1/telephony/twilio`: one Twilio Media Stream, one call, one realtime session.

Calls share the realtime sessions' limit and VAD; with API keys, a stream must bring the token of its
TwiML (stream_auth) and counts against that key's limits. Everything a call holds (its session slot, the
in-flight response in every engine stage, the writer task) is released in `finally`, however the
call ends: `stop`, a disconnect, an idle socket (Twilio streams media all call long) or an error,
logged with the call's streamSid.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from starlette.websockets import WebSocket, WebSocketDisconnect

from omnivoice.server.session.ending import close_connection, serve_until_over
from omnivoice.server.session.receiver import Receiver
from omnivoice.server.session.registry import SessionRefused, Sessions
from omnivoice.server.telephony.stream_auth import stream_owner
from omnivoice.server.telephony.twilio_call import TwilioCall

log = logging.getLogger(__name__)

CLOSE_TRY_AGAIN = 1013


async def twilio_endpoint(websocket: WebSocket) -> None:
    state = websocket.app.state
    sessions: Sessions = state.realtime
    await websocket.accept()
    found = await stream_owner(websocket, state.auth, state.fleet)  # small frames only until then (ws_guard)
    owner, early = found.owner, found.frames
    if owner is None:
        with contextlib.suppress(Exception):  # the carrier may be gone already
            await websocket.close(found.close_code)
        return
    try:
        ticket = await sessions.admit(owner)  # the session itself opens at the call's `start`
    except SessionRefused as e:
        log.warning("telephony call refused: %s", e.message)
        await websocket.close(CLOSE_TRY_AGAIN)
        return
    call = TwilioCall(websocket, ticket, state.profile)
    writer = asyncio.create_task(call.outbox.run(), name=f"twilio-writer-{call.id}")
    code = 1000
    try:
        for frame in early:  # `connected` and `start`, read to authenticate the stream
            if not await call.handle(frame):
                return
        read = _read_loop(websocket, call, writer, sessions.config.idle_timeout_s)
        label = f"call {call.label}"
        code = await serve_until_over(read, call.outbox, writer, lambda: call.session, state.drain, label)
    except WebSocketDisconnect:
        pass
    except Exception:
        log.exception("call %s failed", call.label)
        code = 1011
    finally:
        await call.close()  # aborts the in-flight response in every stage, gives back the session's slot
        # audio still queued is dropped: no one is listening
        await close_connection(websocket, call.outbox, writer, code, flush_s=1.0)


async def _read_loop(
    websocket: WebSocket, call: TwilioCall, writer: asyncio.Task[None], idle_timeout_s: float
) -> None:
    """Handle the carrier's frames until the call stops, the carrier leaves or goes quiet; the frames
    that queued while the last ones were handled are handled together (`TwilioCall.handle_all`)."""
    receiver = Receiver(websocket)
    try:
        while True:
            try:
                async with asyncio.timeout(idle_timeout_s):  # not wait_for: no task per message (ending.py)
                    messages = await receiver.take()
            except TimeoutError:
                log.warning(
                    "call %s: nothing from the carrier for %g s; hanging up", call.label, idle_timeout_s
                )
                return
            if messages is None:
                log.info("call %s: the carrier disconnected", call.label)
                return
            if not await call.handle_all(messages):
                return
            if writer.done():  # the socket failed under the writer
                writer.result()
    finally:
        await receiver.close()
