"""Who a request is: the API key accountable for it, and the client secret it came with, if any."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.requests import HTTPConnection

from omnivoice.server.auth.keys import ANONYMOUS

if TYPE_CHECKING:
    from omnivoice.server.auth.client_secrets import ClientSecret


@dataclass(frozen=True)
class Principal:
    """`owner` is the id of the API key accountable (the minting key for a client secret, `anonymous`
    with no keys); `secret` the client secret used, if any."""

    owner: str
    secret: ClientSecret | None = None


def principal_of(conn: HTTPConnection) -> Principal:
    """The Principal the auth middleware put on this request or WebSocket (`anonymous` on a public
    route)."""
    principal = conn.scope.get("state", {}).get("principal")
    return principal if isinstance(principal, Principal) else Principal(ANONYMOUS)
