"""`GET /v1/realtime`: one WebSocket, one session. Admission, the read loop, idle timeout, clean-up.

Everything the connection holds (its session slot, the in-flight response in every engine stage,
the writer task) is released when it ends, however it ends.
"""

from __future__ import annotations

import asyncio
import logging
import time

from starlette.websockets import WebSocket, WebSocketDisconnect

from omnivoice.server.auth.principal import principal_of
from omnivoice.server.session.conversation import new_id
from omnivoice.server.session.ending import close_connection, serve_until_over
from omnivoice.server.session.outbox import Event, Outbox, OutboxLimits
from omnivoice.server.session.receiver import Receiver
from omnivoice.server.session.registry import SessionRefused, Sessions
from omnivoice.server.session.server_events import error
from omnivoice.server.session.session import Session

log = logging.getLogger(__name__)

CLOSE_TRY_AGAIN = 1013


async def realtime_endpoint(websocket: WebSocket) -> None:
    state = websocket.app.state
    sessions: Sessions = state.realtime
    offered = websocket.scope.get("subprotocols") or []
    principal = principal_of(websocket)  # authenticated by the auth middleware before this
    preset = principal.secret.session if principal.secret else None
    await websocket.accept(subprotocol="realtime" if "realtime" in offered else None)
    sid = new_id("sess")
    beta = "realtime=v1" in websocket.headers.get("openai-beta", "")
    outbox = Outbox(websocket.send_text, sid, beta, OutboxLimits.of(state.profile))
    writer = asyncio.create_task(outbox.run(), name=f"realtime-writer-{sid}")
    code = 1000
    try:
        # a client secret's settings apply first; they were checked when it was issued
        async with sessions.open(principal.owner, outbox, settings=preset) as session:
            log.info(
                "session %s opened (model=%s, %s protocol, %s)",
                sid,
                websocket.query_params.get("model"),
                "beta" if beta else "GA",
                principal.owner,
            )
            session.start()
            read = _read_loop(websocket, session, sessions.config.idle_timeout_s)
            label = f"session {sid}"
            code = await serve_until_over(read, outbox, writer, lambda: session, state.drain, label)
        # leaving the block closed the session: its in-flight response is aborted in every stage
    except SessionRefused as e:
        log.info("session %s refused: %s", sid, e.message)
        outbox.put(_refusal(e))
        code = CLOSE_TRY_AGAIN
    except WebSocketDisconnect:
        pass
    except Exception:
        log.exception("session %s failed", sid)
        code = 1011
    finally:
        await close_connection(websocket, outbox, writer, code, flush_s=2.0)
        log.info("session %s closed", sid)


async def _read_loop(websocket: WebSocket, session: Session, idle_timeout_s: float) -> None:
    """Handle the client's events until it leaves or idles; the events that queued while the last
    ones were handled are handled together (`Session.handle_all`)."""
    receiver = Receiver(websocket)
    last = time.monotonic()
    try:
        while True:
            wait = idle_timeout_s - (time.monotonic() - last)
            try:
                async with asyncio.timeout(max(wait, 0.001)):  # not wait_for: no task per message (ending.py)
                    messages = await receiver.take()
            except TimeoutError:
                if session.busy:  # the client is listening to a response
                    last = time.monotonic()
                    continue
                message = f"the session was idle for {idle_timeout_s:g} s and is closed"
                session.outbox.put(error(message, "session_idle_timeout"))
                return
            if messages is None:  # the client disconnected
                return
            last = time.monotonic()
            await session.handle_all(messages)
            # let the other clients in between (what this one queued meanwhile is taken at once)
            await asyncio.sleep(0)
    finally:
        await receiver.close()


def _refusal(e: SessionRefused) -> Event:
    """The `error` event that says why a session cannot open (then the socket closes 1013)."""
    if e.kind == "rate_limited":
        return error(e.message, "rate_limit_exceeded", type_="rate_limit_error")
    if e.kind == "capacity":  # the engine could not serve its audio in real time
        return error(e.message, "server_overloaded", type_="server_error")
    kind = "session_limit_reached" if e.kind == "session_limit" else "service_unavailable"
    return error(e.message, kind, type_="server_error")
