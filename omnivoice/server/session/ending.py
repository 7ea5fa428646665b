"""How a realtime connection ends besides the client leaving: the client stops reading (its outbox
fails: close 1008), or the server shuts down (the drain: the response in flight may finish, then an
`error` event `server_shutting_down` and close 1001). Shared by the WebSocket, Twilio and WebRTC.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from starlette.websockets import WebSocket, WebSocketState

from omnivoice.server.session.outbox import Outbox, SlowConsumer
from omnivoice.server.session.server_events import error

if TYPE_CHECKING:
    from omnivoice.server.drain import Drain
    from omnivoice.server.session.session import Session

log = logging.getLogger(__name__)

CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_POLICY = 1008  # the client did not read what it was sent
CLOSE_ERROR = 1011
SHUTDOWN_MESSAGE = "the server is shutting down; reconnect to continue"


async def shutdown_notice(session: Callable[[], Session | None], drain: Drain) -> None:
    """Return once the drain wants this connection closed: at once if no response is in flight, else
    when it is done or the drain expires (then it is cancelled). The notice is queued on return."""
    await drain.started.wait()
    s = session()
    while s is not None and s.busy and not drain.expired.is_set():
        await asyncio.sleep(0.05)
    if s is None:
        return
    if s.response is not None:
        await s.response.cancel("server_shutting_down")
    s.outbox.put(error(SHUTDOWN_MESSAGE, "server_shutting_down", type_="server_error"))


async def serve_until_over(
    read: Coroutine[Any, Any, None],
    outbox: Outbox,
    writer: asyncio.Task[None],
    session: Callable[[], Session | None],
    drain: Drain,
    label: str,
) -> int:
    """Run the read loop until the client leaves (1000), stops reading (1008), the socket fails
    (1011) or the server shuts down (1001); returns that close code. Read loop errors propagate."""
    reader = asyncio.create_task(read)
    failed = asyncio.create_task(outbox.failed.wait())
    shutdown = asyncio.create_task(shutdown_notice(session, drain))
    try:
        await asyncio.wait((reader, writer, failed, shutdown), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (reader, failed, shutdown):
            task.cancel()
        await asyncio.gather(reader, failed, shutdown, return_exceptions=True)
    problem = outbox.failure or (writer.exception() if writer.done() and not writer.cancelled() else None)
    if isinstance(problem, SlowConsumer):
        log.warning("%s: dropping a client that stopped reading: %s (close %d)", label, problem, CLOSE_POLICY)
        return CLOSE_POLICY
    if reader.done() and not reader.cancelled():
        reader.result()  # raises what ended the read loop (a disconnect, an error)
        return CLOSE_NORMAL
    if problem is not None:
        log.info("%s: the socket failed: %r", label, problem)
        return CLOSE_ERROR
    log.info("%s: closed for the server's shutdown (close %d)", label, CLOSE_GOING_AWAY)
    return CLOSE_GOING_AWAY


async def close_connection(
    websocket: WebSocket, outbox: Outbox, writer: asyncio.Task[None], code: int, flush_s: float
) -> None:
    """End a WebSocket connection: stop the outbox, give its writer `flush_s` to send the last events
    (the reason for closing; none for a client that stopped reading, CLOSE_POLICY), then close with
    `code` unless either side already did."""
    outbox.close()
    # No asyncio.wait_for here: awaiting a failed writer would raise its exception in this frame, and
    # wait_for runs what it awaits in a task of its own that ends holding its exception. Either way
    # the exception's traceback holds frames that hold the task: a cycle that keeps the connection
    # (session, audio, the socket's compressor) until the cyclic GC runs, rarely in a model server.
    await asyncio.wait([writer], timeout=0 if code == CLOSE_POLICY else flush_s)
    if not writer.done():
        writer.cancel()
    elif not writer.cancelled():
        writer.exception()  # retrieved: serve_until_over logged why the socket failed
    outbox.abandon()
    if (
        websocket.client_state == WebSocketState.CONNECTED
        and websocket.application_state == WebSocketState.CONNECTED
    ):
        with contextlib.suppress(Exception):  # the peer is already gone, or reads nothing
            async with asyncio.timeout(1.0):
                await websocket.close(code)
