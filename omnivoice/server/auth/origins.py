"""Which browser origins may use the server, and the CORS headers that let an allowed one read answers.

A browser names the page that opened a request in `Origin` (always on WebSockets and on POSTs). The
server's own page is same-origin (Origin's host and port are the request's Host); other origins must
be listed in `auth.allowed_origins` (`*` for any). Requests without Origin come from programs, not
pages, and pass (their API key is what protects the server).
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}
ALLOW_METHODS = "GET, POST"
EXPOSE_HEADERS = "Location, X-Request-Id, Retry-After"
PREFLIGHT_MAX_AGE_S = "600"


class OriginPolicy:
    def __init__(self, allowed: Sequence[str]) -> None:
        self._any = "*" in allowed
        self._allowed = frozenset(o.lower().rstrip("/") for o in allowed if o != "*")

    def verdict(self, origin: str | None, host: str | None) -> str:
        """`none` (no Origin), `same` (the server's own page), `cross` (an allowed other origin) or
        `denied`."""
        if origin is None:
            return "none"
        if host and same_origin(origin, host):
            return "same"
        if self._any or origin.lower().rstrip("/") in self._allowed:
            return "cross"
        return "denied"


def same_origin(origin: str, host: str) -> bool:
    """Whether the Origin `scheme://host[:port]` names the Host `host[:port]` the request was sent to."""
    try:
        o = urlsplit(origin)
        h = urlsplit("//" + host)
        o_port = o.port or DEFAULT_PORTS.get(o.scheme)
        h_port = h.port
    except ValueError:
        return False
    if o.scheme not in DEFAULT_PORTS or not o.hostname or o.hostname != h.hostname:
        return False
    return o_port == (h_port if h_port is not None else DEFAULT_PORTS[o.scheme])


def cors_headers(origin: str) -> list[tuple[bytes, bytes]]:
    """Headers that let the page at `origin` (an allowed cross origin) read a response."""
    return [
        (b"access-control-allow-origin", origin.encode("latin-1")),
        (b"access-control-expose-headers", EXPOSE_HEADERS.encode()),
        (b"vary", b"Origin"),
    ]


def preflight_headers(origin: str, requested_headers: str) -> list[tuple[bytes, bytes]]:
    """The answer to an allowed origin's CORS preflight (OPTIONS): methods, the headers it asked for."""
    headers = [
        (b"access-control-allow-origin", origin.encode("latin-1")),
        (b"access-control-allow-methods", ALLOW_METHODS.encode()),
        (b"access-control-max-age", PREFLIGHT_MAX_AGE_S.encode()),
        (b"vary", b"Origin"),
    ]
    if requested_headers:
        headers.append((b"access-control-allow-headers", requested_headers.encode("latin-1")))
    return headers
