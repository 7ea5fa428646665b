"""The auth policy of each route, and who a request is (`Principal`).

- public: `/health`, the page (`/`, `/web/...`), `/metrics` with `auth.public_metrics`, and the
  Twilio media stream (authenticated in the stream itself, by a one-use token from the TwiML);
- an API key or a live client secret (`ek_...`): `/v1/realtime`, `/v1/realtime/calls[/{id}/hangup]`;
- an API key as Bearer or HTTP Basic password (Twilio's `https://user:KEY@host/...` webhooks): the TwiML;
- an API key: everything else (unknown paths too, so no route is left open by mistake).

With no key configured every request is `anonymous` and only a dead `ek_` secret on a realtime route
is refused (a server with no keys listens on loopback only, see keys.check_bind).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Literal

from omnivoice.config import AuthConfig
from omnivoice.server.auth.client_secrets import PREFIX as SECRET_PREFIX
from omnivoice.server.auth.client_secrets import ClientSecrets, presented_token
from omnivoice.server.auth.failures import AuthFailures
from omnivoice.server.auth.keys import ANONYMOUS, ApiKeys
from omnivoice.server.auth.limits import KeyLimits
from omnivoice.server.auth.origins import HostPolicy, OriginPolicy
from omnivoice.server.auth.principal import Principal
from omnivoice.server.auth.stream_tokens import StreamTokens
from omnivoice.server.errors import APIError
from omnivoice.server.tally import Tally

Access = Literal["public", "key", "key_or_secret", "key_or_basic"]

REALM = 'realm="omnivoice"'
TWIML_PATH = "/v1/telephony/twilio/twiml"
SECRET_PATHS = ("/v1/realtime", "/v1/realtime/calls")


class Auth:
    """App-wide: the keys, the client-secret store, hosts and origins, per-key limits, Twilio stream
    tokens. `own_hosts`: the server's own names (the host it is bound to, its public URL's)."""

    def __init__(
        self, config: AuthConfig, keys: ApiKeys, own_hosts: Sequence[str] = (), tally: Tally | None = None
    ) -> None:
        self.config = config
        self.keys = keys
        self.secrets = ClientSecrets()
        self.hosts = HostPolicy(config.allowed_hosts, config.allowed_origins, own_hosts)
        self.origins = OriginPolicy(config.allowed_origins)
        self.limits = KeyLimits(config.rate_limit, tally=tally)
        self.failures = AuthFailures(config.max_failed_auth_per_minute)
        self.stream_tokens = StreamTokens()

    def access(self, path: str, websocket: bool) -> Access:
        if path in ("/health", "/") or path.startswith("/web/"):
            return "public"
        if path == "/metrics" and self.config.public_metrics:
            return "public"
        if websocket and path == "/v1/telephony/twilio":
            return "public"  # the stream's `start` brings a one-use token (twilio_endpoint)
        if path in SECRET_PATHS or (path.startswith("/v1/realtime/calls/") and path.endswith("/hangup")):
            return "key_or_secret"
        if path == TWIML_PATH:
            return "key_or_basic"
        return "key"

    def authenticate(
        self, path: str, headers: Mapping[str, str], subprotocols: Sequence[str] = (), websocket: bool = False
    ) -> Principal | None:
        """The request's Principal (None on a public route), or a 401 APIError. Never puts the
        presented token in a message."""
        access = self.access(path, websocket)
        if access == "public":
            return None
        token = presented_token(headers, subprotocols)
        if token is None and access == "key_or_basic":
            token = basic_password(headers)
        if token is not None and token.startswith(SECRET_PREFIX) and access == "key_or_secret":
            secret = self.secrets.get(token)
            if secret is None:
                raise unauthorized("the client secret is invalid or has expired", access)
            return Principal(secret.owner, secret)
        if not self.keys:
            return Principal(ANONYMOUS)
        if token is None:
            how = "HTTP Basic auth (the key as password) or " if access == "key_or_basic" else ""
            raise unauthorized(f"missing API key: send it as {how}'Authorization: Bearer <key>'", access)
        owner = self.keys.match(token)
        if owner is None:
            if token.startswith(SECRET_PREFIX):
                raise unauthorized("client secrets open realtime sessions only; use an API key", access)
            raise unauthorized("incorrect API key provided", access)
        return Principal(owner)


def unauthorized(message: str, access: Access) -> APIError:
    scheme = "Basic" if access == "key_or_basic" else "Bearer"  # Twilio retries with credentials on Basic
    return APIError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": f"{scheme} {REALM}"})


def basic_password(headers: Mapping[str, str]) -> str | None:
    """The password of `Authorization: Basic` (the user name is ignored; a lone user name is taken)."""
    auth = headers.get("authorization", "")
    if auth[:6].lower() != "basic ":
        return None
    try:
        user, _, password = base64.b64decode(auth[6:].strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return password or user or None
