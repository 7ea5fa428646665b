"""WebSockets before authentication: uvicorn's WebSocket protocol (websockets' sans-I/O one, uvicorn's
default) with a small message limit, `PREAUTH_BYTES`, until the app lifts it (`lift_message_limit`).

uvicorn applies one `ws_max_size` to every WebSocket, as large as the largest realtime event a client
may send, and buffers a whole frame before the app sees it; so a client with no credentials could
make the server hold that much per connection. Here a larger frame is refused from its header, before
its payload is read (close 1009). The auth middleware lifts the limit for a WebSocket it authenticated
(an API key or client secret; any, on a server without keys); the Twilio stream, whose credential
comes in its `start` message, lifts it once its token is redeemed. Lifted, the limit is `ws_max_size`.

Two things anyone can provoke are not logged as errors, as uvicorn's protocol logs them: an HTTP
answer to the handshake (an auth refusal: 401, 403, 421, 429) counts as a completed handshake ("ASGI
callable returned without completing handshake"), and a text message that is not UTF-8 closes the
connection 1007 with an INFO line (uvicorn: an ERROR with a traceback).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from starlette.types import Scope
from uvicorn.config import Config
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from uvicorn.server import ServerState
from websockets.http11 import Request

if TYPE_CHECKING:
    from uvicorn._types import ASGISendEvent

log = logging.getLogger(__name__)

PREAUTH_BYTES = 64 * 1024  # per message, and in all before the Twilio stream's `start`
EXTENSION = "omnivoice.message_limit"  # the ASGI scope extension that lifts it


class PreAuthWebSocket(WebSocketsSansIOProtocol):
    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.conn.max_size = min(PREAUTH_BYTES, config.ws_max_size)  # read per frame by the parser

    def handle_connect(self, event: Request) -> None:
        super().handle_connect(event)  # schedules the app, which has not run yet
        if self.response.status_code == 101:
            self.scope["extensions"][EXTENSION] = {"lift": self._lift}  # type: ignore[index]

    def _lift(self) -> None:
        self.conn.max_size = self.config.ws_max_size

    def send_receive_event_to_app(self) -> None:
        if self.curr_msg_data_type == "text" and not _utf8(self.frames):
            log.info("client %s sent a text message that is not UTF-8; closing (1007)", self.client)
            self.frames = []
            self.conn.send_close(1007, "invalid UTF-8")
            self.handle_parser_exception()  # uvicorn's way out of a protocol error: disconnect, close
            return
        super().send_receive_event_to_app()

    async def send(self, message: ASGISendEvent) -> None:
        await super().send(message)
        if message["type"] == "websocket.http.response.body" and not message.get("more_body", False):
            self.handshake_complete = True  # refused with an HTTP answer: that handshake is over


def _utf8(frames: list[bytes]) -> bool:
    try:
        (frames[0] if len(frames) == 1 else b"".join(frames)).decode()
    except UnicodeDecodeError:
        return False
    return True


def lift_message_limit(scope: Scope) -> None:
    """Allow an authenticated WebSocket messages up to the server's `ws_max_size` (a no-op under a
    server without PreAuthWebSocket)."""
    limit = (scope.get("extensions") or {}).get(EXTENSION)
    if limit is not None:
        limit["lift"]()
