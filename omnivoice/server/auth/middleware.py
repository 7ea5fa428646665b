"""The ASGI middleware that runs the auth policy (guard.Auth) before any route, HTTP or WebSocket:
the Host (on a server without keys, a Host it does not answer to gets 421: DNS rebinding), origin
check (403), CORS preflight and headers for allowed other origins, the API key or client secret
(401; an address with too many failed attempts gets 429 first), and, for HTTP, the key's request rate
(429). A WebSocket is refused before its handshake completes (an HTTP answer); one it lets through
may send large messages from then on (ws_guard). The realtime endpoints count its request and
session against the key themselves, so that a client over a limit reads a Realtime `error` event."""

from __future__ import annotations

import logging

from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket

from omnivoice.server.auth.guard import Auth
from omnivoice.server.auth.limits import RateLimited
from omnivoice.server.auth.origins import cors_headers, preflight_headers, same_origin
from omnivoice.server.errors import APIError, rate_limited
from omnivoice.server.ws_guard import lift_message_limit

log = logging.getLogger(__name__)


class AuthMiddleware:
    def __init__(self, app: ASGIApp, auth: Auth) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        websocket = scope["type"] == "websocket"
        headers = Headers(scope=scope)
        origin, host = headers.get("origin"), headers.get("host")
        served = self.auth.hosts.serves(host)
        if not served and not self.auth.keys:
            log.info("%s %s refused: Host %r is not served", scope["type"], scope["path"], host)
            await _refuse(scope, receive, send, host_not_served(host))
            return
        verdict = self.auth.origins.verdict(origin, host if served else None)  # same only on served Hosts
        if verdict == "denied":
            log.info("%s %s refused: origin %r not allowed", scope["type"], scope["path"], origin)
            await _refuse(scope, receive, send, origin_denied(origin, host, served))
            return
        if verdict == "cross" and not websocket:
            assert origin is not None
            if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
                extra = preflight_headers(origin, headers.get("access-control-request-headers", ""))
                await Response(status_code=204, headers=dict(_str(extra)))(scope, receive, send)
                return
            send = _with_headers(send, cors_headers(origin))
        address = (scope.get("client") or ("unknown", 0))[0]
        try:
            if self.auth.access(scope["path"], websocket) != "public":
                self.auth.failures.check(address)
            subprotocols = scope.get("subprotocols") or []
            principal = self.auth.authenticate(scope["path"], headers, subprotocols, websocket)
            if principal is not None and not websocket:
                self.auth.limits.take(principal.owner)
        except APIError as err:
            log.info("%s %s refused: %s", scope["type"], scope["path"], err.message)
            if err.status == 401:
                self.auth.failures.failed(address)
            await _refuse(scope, receive, send, err)
            return
        except RateLimited as e:
            log.info("%s %s refused: %s", scope["type"], scope["path"], e.message)
            await _refuse(scope, receive, send, rate_limited(e.message, e.retry_after_s))
            return
        scope.setdefault("state", {})["principal"] = principal
        if websocket and principal is not None:
            lift_message_limit(scope)
        await self.app(scope, receive, send)


def host_not_served(host: str | None) -> APIError:
    name = (host or "")[:100]
    message = (
        f"this server does not answer to the host {name!r}: without an API key it serves localhost, IP "
        "addresses and auth.allowed_hosts only"
    )
    return APIError(421, message, code="host_not_allowed")


def origin_denied(origin: str | None, host: str | None, served: bool) -> APIError:
    message = "this origin is not allowed"
    if not served and origin and host and same_origin(origin, host):
        message += f" (its host {host[:100]!r} is not one this server answers to: see auth.allowed_hosts)"
    return APIError(403, message, code="origin_not_allowed")


async def _refuse(scope: Scope, receive: Receive, send: Send, err: APIError) -> None:
    if scope["type"] == "http":
        await err.response()(scope, receive, send)
        return
    ws = WebSocket(scope, receive, send)
    if "websocket.http.response" in scope.get("extensions", {}):
        await ws.send_denial_response(err.response())  # the client reads the status and the JSON error
    else:
        await ws.close(1008, err.message)  # the server answers the handshake with 403


def _with_headers(send: Send, extra: list[tuple[bytes, bytes]]) -> Send:
    async def sender(message: Message) -> None:
        if message["type"] == "http.response.start":
            names = {name for name, _ in extra}
            kept = [h for h in message.get("headers", []) if h[0].lower() not in names]
            message = {**message, "headers": [*kept, *extra]}
        await send(message)

    return sender


def _str(headers: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]
