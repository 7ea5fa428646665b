"""Server-sent events that stop generating the moment the client goes away.

Starlette's StreamingResponse cancels its send loop on disconnect but leaves the body generator
suspended until garbage collection, so the engine would keep generating for a client that is
gone. `EventStreamResponse` watches for `http.disconnect` itself and always `aclose()`s the
generator, whose `finally` aborts the engine request.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Callable, Coroutine
from typing import Any, TypeVar

from starlette.types import Receive, Scope, Send

DONE = b"data: [DONE]\n\n"
T = TypeVar("T")


def sse_event(payload: dict[str, Any]) -> bytes:
    """One SSE `data:` event; compact JSON never contains a raw newline."""
    return b"data: " + json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


async def wait_for_disconnect(receive: Receive) -> None:
    """Return once the client has disconnected (call after the request body was read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def run_unless_disconnected(receive: Receive, coro: Coroutine[Any, Any, T]) -> T | None:
    """Run `coro`, cancelling it if the client disconnects first (then return None)."""
    work = asyncio.ensure_future(coro)
    watch = asyncio.ensure_future(wait_for_disconnect(receive))
    try:
        await asyncio.wait((work, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()
        await asyncio.gather(work, watch, return_exceptions=True)
    return None if work.cancelled() else work.result()


class EventStreamResponse:
    """ASGI response streaming `events` (already framed bytes) as `text/event-stream`.

    `on_close` runs exactly once when the response ends for any reason (done, error, disconnect,
    server shutdown) — even if the generator never started, which its own `finally` cannot cover.
    """

    def __init__(
        self,
        events: AsyncGenerator[bytes, None],
        *,
        headers: dict[str, str] | None = None,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self._events = events
        self._on_close = on_close
        self._headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),  # tell nginx-style proxies not to buffer the stream
            *((k.lower().encode(), v.encode()) for k, v in (headers or {}).items()),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self._headers})
            stream = asyncio.ensure_future(self._stream(send))
            watch = asyncio.ensure_future(wait_for_disconnect(receive))
            try:
                await asyncio.wait((stream, watch), return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (stream, watch):
                    task.cancel()
                await asyncio.gather(stream, watch, return_exceptions=True)
            if stream.done() and not stream.cancelled() and stream.exception() is not None:
                raise stream.exception()  # type: ignore[misc]
        finally:
            await self._events.aclose()
            if self._on_close is not None:
                self._on_close()

    async def _stream(self, send: Send) -> None:
        async for event in self._events:
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
