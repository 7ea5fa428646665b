"""`GET /v1/realtime`: one WebSocket, one session. Admission, the read loop, idle timeout, clean-up.

Everything the connection holds (its session slot, the in-flight response in every engine stage,
the writer task) is released in `finally`, however the connection ends.
"""

from __future__ import annotations

import asyncio
import logging
import time

from starlette.websockets import WebSocket, WebSocketDisconnect

from omnivoice.server.auth.limits import RateLimited, SessionLease
from omnivoice.server.auth.principal import principal_of
from omnivoice.server.errors import APIError
from omnivoice.server.realtime.conversation import new_id
from omnivoice.server.realtime.ending import close_connection, serve_until_over
from omnivoice.server.realtime.outbox import Event, Outbox, OutboxLimits
from omnivoice.server.realtime.server_events import error
from omnivoice.server.realtime.service import RealtimeService, SessionLimitReached
from omnivoice.server.realtime.session import Session

log = logging.getLogger(__name__)

CLOSE_TRY_AGAIN = 1013


async def realtime_endpoint(websocket: WebSocket) -> None:
    state = websocket.app.state
    service: RealtimeService = state.realtime
    offered = websocket.scope.get("subprotocols") or []
    principal = principal_of(websocket)  # authenticated by the auth middleware before this
    preset = principal.secret.session if principal.secret else None
    await websocket.accept(subprotocol="realtime" if "realtime" in offered else None)
    sid = new_id("sess")
    beta = "realtime=v1" in websocket.headers.get("openai-beta", "")
    outbox = Outbox(websocket.send_text, sid, beta, OutboxLimits.of(state.profile))
    writer = asyncio.create_task(outbox.run(), name=f"realtime-writer-{sid}")
    session: Session | None = None
    lease: SessionLease | None = None
    reserved = False
    code = 1000
    try:
        try:
            engine = state.lifecycle.require()
            state.auth.limits.take(principal.owner)
            lease = state.auth.limits.claim_session(principal.owner)
            service.reserve()
            reserved = True
        except (APIError, SessionLimitReached, RateLimited) as e:
            log.info("session %s refused: %s", sid, getattr(e, "message", e))
            outbox.put(_refusal(e))
            code = CLOSE_TRY_AGAIN
            return
        session = Session(
            sid, engine, outbox, await service.vad(), profile=state.profile, admission=state.admission
        )
        if preset:
            session.apply_settings(preset)  # the client secret's settings; checked when it was issued
        service.sessions[sid] = session
        log.info(
            "session %s opened (model=%s, %s protocol, %s)",
            sid,
            websocket.query_params.get("model"),
            "beta" if beta else "GA",
            principal.owner,
        )
        session.start()
        read = _read_loop(websocket, session, service.config.idle_timeout_s)
        code = await serve_until_over(read, outbox, writer, lambda: session, state.drain, f"session {sid}")
    except WebSocketDisconnect:
        pass
    except Exception:
        log.exception("session %s failed", sid)
        code = 1011
    finally:
        if session is not None:
            await session.close()  # aborts the in-flight response in every stage
        if reserved:
            service.release(sid)
        if lease is not None:
            lease.release()
        await close_connection(websocket, outbox, writer, code, flush_s=2.0)
        log.info("session %s closed", sid)


async def _read_loop(websocket: WebSocket, session: Session, idle_timeout_s: float) -> None:
    last = time.monotonic()
    while True:
        wait = idle_timeout_s - (time.monotonic() - last)
        try:
            async with asyncio.timeout(max(wait, 0.001)):  # not wait_for: no task per message (ending.py)
                message = await websocket.receive()
        except TimeoutError:
            if session.busy:  # the client is listening to a response
                last = time.monotonic()
                continue
            session.outbox.put(
                error(f"the session was idle for {idle_timeout_s:g} s and is closed", "session_idle_timeout")
            )
            return
        if message["type"] == "websocket.disconnect":
            return
        last = time.monotonic()
        data = message.get("text")
        if data is None:
            data = message.get("bytes") or b""
        await session.handle(data)


def _refusal(e: Exception) -> Event:
    """The `error` event that says why a session cannot open (then the socket closes 1013)."""
    if isinstance(e, RateLimited):
        return error(e.message, "rate_limit_exceeded", type_="rate_limit_error")
    kind = "session_limit_reached" if isinstance(e, SessionLimitReached) else "service_unavailable"
    return error(str(getattr(e, "message", e)), kind, type_="server_error")
