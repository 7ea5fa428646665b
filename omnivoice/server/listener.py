"""How `omnivoice serve` listens: the uvicorn configuration, hardened against clients that are slow,
greedy or lie about where they come from.

- HTTP: the h11 protocol with a header timeout and a cap on connections per client address
  (http_guard); bodies have their own deadline in the app (body_timeout).
- WebSocket: a small message limit until the connection is authenticated (ws_guard), then
  `2 * realtime.max_event_bytes` (a larger frame: close 1009; Session refuses smaller oversized
  events with an error event). No permessage-deflate unless `server.ws_per_message_deflate`: the
  audio sent is base64 PCM or G.711, and deflating every frame costs the event loop more than it saves.
- `X-Forwarded-For` / `X-Forwarded-Proto` are believed only from `server.trusted_proxies` (uvicorn
  believes loopback by default, which let a local client pose as any address to the failed-auth
  limiter).
"""

from __future__ import annotations

import uvicorn
from starlette.types import ASGIApp

from omnivoice.config import Profile
from omnivoice.server.http_guard import ClientConnections, guarded_h11
from omnivoice.server.ws_guard import PreAuthWebSocket


def server_config(
    app: ASGIApp, profile: Profile, host: str, port: int, log_level: str | None
) -> uvicorn.Config:
    """The uvicorn Config that serves `app` (built by create_app from `profile`) on `host:port`."""
    server = profile.server
    connections = ClientConnections(server.max_connections_per_client, exempt=server.trusted_proxies)
    return uvicorn.Config(
        app, host=host, port=port, log_level=log_level, log_config=None, access_log=False,
        lifespan="on", timeout_graceful_shutdown=10,
        http=guarded_h11(server.header_timeout_s, connections),
        ws=PreAuthWebSocket,
        ws_max_size=2 * profile.realtime.max_event_bytes,
        ws_per_message_deflate=server.ws_per_message_deflate,
        proxy_headers=bool(server.trusted_proxies),
        forwarded_allow_ips=list(server.trusted_proxies),
    )  # fmt: skip
