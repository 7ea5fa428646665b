"""Which Host names the server answers to, which browser origins may use it, and the CORS headers that
let an allowed other origin read answers.

A browser names the page that opened a request in `Origin` (always on WebSockets and on POSTs). The
server's own page is same-origin (Origin's host and port are the request's Host), but only when that
Host is one the server answers to (`HostPolicy`): a page on an attacker's domain whose DNS name is
made to resolve to 127.0.0.1 (DNS rebinding) sends its own name as both Host and Origin, so Host alone
proves nothing. Other origins must be listed in `auth.allowed_origins` (`*` for any). Requests without
Origin come from programs, not pages, and pass (their API key is what protects the server).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from urllib.parse import urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}
ALLOW_METHODS = "GET, POST"
EXPOSE_HEADERS = "Location, X-Request-Id, Retry-After"
PREFLIGHT_MAX_AGE_S = "600"
LOOPBACK_NAMES = ("localhost",)
_HOST = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(?::[0-9]{1,5})?")


class HostPolicy:
    """The Host names the server answers to as itself: `localhost`, IP addresses (a browser that sends
    one connected to that address, which DNS cannot change), its own names (the host it is bound to,
    telephony.public_url's), the hosts of `auth.allowed_origins` and `auth.allowed_hosts` (`*`: any)."""

    def __init__(self, allowed: Sequence[str], origins: Sequence[str] = (), own: Sequence[str] = ()) -> None:
        self._any = "*" in allowed
        names = {h.lower() for h in allowed if h != "*"} | set(LOOPBACK_NAMES)
        names |= {urlsplit(o).hostname or "" for o in origins if o != "*"}
        names |= {n.lower() for n in own if not _is_ip(n.strip("[]"))}
        self._names = frozenset(names - {""})

    def serves(self, host: str | None) -> bool:
        """Whether a request's `Host` header (`name[:port]`) names this server; a request without one
        (HTTP/1.0: no browser) does."""
        if host is None or self._any:
            return True
        match = _HOST.fullmatch(host.strip())
        if match is None:
            return False
        name = match.group(1).lower()
        return name in self._names or _is_ip(name.strip("[]"))


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


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
