"""Short-lived client secrets (`ek_...`) for browsers and mobile apps: the store, and where a request
presents its token.

A browser cannot keep the server's API key; its own backend mints a client secret for it (`POST
/v1/realtime/client_secrets`, omnivoice.server.realtime.client_secrets) and the browser opens the
realtime session with it, over the WebSocket (`Authorization: Bearer ek_...`, or the subprotocol
`openai-insecure-api-key.ek_...`) or WebRTC (`POST /v1/realtime/calls` with the bearer header). The
session settings given with the secret apply when the session opens. Secrets live in the app's store
(`Auth.secrets`) until they expire; each is charged to the key that minted it (per-key limits).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from omnivoice.server.auth.keys import ANONYMOUS

PREFIX = "ek_"
SUBPROTOCOL_PREFIX = "openai-insecure-api-key."


@dataclass(frozen=True)
class ClientSecret:
    value: str
    expires_at: float  # unix time
    session: dict[str, Any]  # a `session.update` object, applied when a session opens with it
    owner: str = ANONYMOUS  # id of the API key that minted it: its limits apply


class ClientSecrets:
    """Issued secrets until they expire; expired ones are forgotten as new ones are issued."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._secrets: dict[str, ClientSecret] = {}

    def issue(self, session: dict[str, Any], ttl_s: float, owner: str = ANONYMOUS) -> ClientSecret:
        self._purge()
        secret = ClientSecret(PREFIX + secrets.token_urlsafe(24), self._clock() + ttl_s, session, owner)
        self._secrets[secret.value] = secret
        return secret

    def add(self, secret: ClientSecret) -> None:
        """Keep `secret`, issued by another front end of the server (server/fleet/)."""
        self._purge()
        self._secrets[secret.value] = secret

    def get(self, value: str) -> ClientSecret | None:
        """The live secret `value`, or None (unknown or expired)."""
        secret = self._secrets.get(value)
        if secret is not None and secret.expires_at <= self._clock():
            del self._secrets[value]
            return None
        return secret

    def __len__(self) -> int:
        return len(self._secrets)

    def _purge(self) -> None:
        now = self._clock()
        for value in [v for v, s in self._secrets.items() if s.expires_at <= now]:
            del self._secrets[value]


def presented_token(headers: Mapping[str, str], subprotocols: Sequence[str] = ()) -> str | None:
    """The bearer token of a request: `Authorization: Bearer X`, else a browser's key subprotocol."""
    auth = headers.get("authorization", "")
    if auth[:7].lower() == "bearer " and auth[7:].strip():
        return auth[7:].strip()
    for proto in subprotocols:
        if proto.startswith(SUBPROTOCOL_PREFIX):
            return proto[len(SUBPROTOCOL_PREFIX) :]
    return None
