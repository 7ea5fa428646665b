"""Server-sent events that stop generating the moment the client goes away.

Starlette's StreamingResponse cancels its send loop on disconnect but leaves the body generator
suspended until garbage collection, so the engine would keep generating for a client that is
gone. `EventStreamResponse` watches for `http.disconnect` itself and always `aclose()`s the
generator, whose `finally` aborts the engine request. It also drops a client that stops reading
(a send blocked `send_timeout_s`) and ends the stream with a farewell event when told to `stop`
(server shutdown).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, Callable, Coroutine
from typing import Any, TypeVar

from starlette.types import Receive, Scope, Send

log = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"
T = TypeVar("T")


class SlowReader(Exception):
    """The client took no data for `send_timeout_s` (it stopped reading; its buffers are full)."""


def sse_event(payload: dict[str, Any]) -> bytes:
    """One SSE `data:` event; compact JSON never contains a raw newline."""
    return b"data: " + json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


async def wait_for_disconnect(receive: Receive) -> None:
    """Return once the client has disconnected (call after the request body was read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def run_unless_disconnected(
    receive: Receive, coro: Coroutine[Any, Any, T], stop: asyncio.Event | None = None
) -> T | None:
    """Run `coro`, cancelling it if the client disconnects (or `stop` is set) first; then None."""
    work = asyncio.ensure_future(coro)
    watch = asyncio.ensure_future(wait_for_disconnect(receive))
    stopped = asyncio.ensure_future((stop or asyncio.Event()).wait())
    try:
        await asyncio.wait((work, watch, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        stopped.cancel()
        if not work.done():
            work.cancel()
        await asyncio.gather(work, watch, stopped, return_exceptions=True)
    return None if work.cancelled() else work.result()


class EventStreamResponse:
    """ASGI response streaming `events` (already framed bytes) as `text/event-stream`.

    `on_close` runs exactly once when the response ends for any reason (done, error, disconnect,
    server shutdown) — even if the generator never started, which its own `finally` cannot cover.
    A send blocked for `send_timeout_s` drops the client (its generator is closed; uvicorn then
    closes the connection). When `stop` is set, the generator is closed and `farewell` ends the body.
    """

    def __init__(
        self,
        events: AsyncGenerator[bytes, None],
        *,
        headers: dict[str, str] | None = None,
        on_close: Callable[[], None] | None = None,
        send_timeout_s: float | None = None,
        stop: asyncio.Event | None = None,
        farewell: bytes = b"",
        label: str = "event stream",
    ) -> None:
        self._events = events
        self._on_close = on_close
        self._send_timeout_s = send_timeout_s
        self._stop = stop or asyncio.Event()
        self._farewell = farewell
        self._label = label
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
            stopped = asyncio.ensure_future(self._stop.wait())
            tasks = (stream, watch, stopped)
            first: set[asyncio.Future[Any]] = set()
            try:
                first, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            error = stream.exception() if stream.done() and not stream.cancelled() else None
            if isinstance(error, SlowReader):
                wait = self._send_timeout_s
                log.warning("%s: the client read nothing for %g s; dropped", self._label, wait)
            elif error is not None:
                raise error
            elif first == {stopped}:  # told to stop (shutdown) while streaming, the client still there
                await self._events.aclose()  # abort the engine request before saying goodbye
                with contextlib.suppress(SlowReader):
                    await self._send(send, self._farewell, more=False)
        finally:
            await self._events.aclose()
            if self._on_close is not None:
                self._on_close()

    async def _stream(self, send: Send) -> None:
        async for event in self._events:
            await self._send(send, event)
        await self._send(send, b"", more=False)

    async def _send(self, send: Send, body: bytes, more: bool = True) -> None:
        try:
            async with asyncio.timeout(self._send_timeout_s):
                await send({"type": "http.response.body", "body": body, "more_body": more})
        except TimeoutError:
            raise SlowReader from None
