"""A request's body must arrive within `server.body_timeout_s` of its headers, or it gets 408.

uvicorn waits for a body as long as the client keeps the connection open, so a client sending a byte
now and then held a connection, a file descriptor and a request task for ever. The deadline covers
the whole body, not the gap between chunks (which a trickle would keep short). Once the body is
complete, `receive` is left alone: a streaming response listens on it for the client leaving.
The 408 (`request_timeout`, with `Connection: close`) is raised from `receive`, inside the route
that reads the body, and answered by the app's APIError handler.
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from omnivoice.server.errors import request_timeout


class BodyTimeoutMiddleware:
    def __init__(self, app: ASGIApp, timeout_s: float) -> None:
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        complete = False

        async def receive_in_time() -> Message:
            nonlocal complete
            if complete:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise request_timeout(self.timeout_s) from None
            complete = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        await self.app(scope, receive_in_time, send)
