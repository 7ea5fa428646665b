"""Short-lived client secrets for browsers and mobile apps: `POST /v1/realtime/client_secrets`.

A browser cannot keep the server's API key; it asks its own backend for a client secret (`ek_...`,
OpenAI's shape: `{value, expires_at, session}`) and opens the realtime session with it, over the
WebSocket (`Authorization: Bearer ek_...`, or the subprotocol `openai-insecure-api-key.ek_...`) or
WebRTC (`POST /v1/realtime/calls` with the bearer header). The session settings given with the secret
apply when the session opens. Secrets live in an app-owned store (`RealtimeService.secrets`) until
they expire. Minting one needs an API key (when the server has keys); each secret is charged to the
key that minted it (per-key limits). omnivoice/server/auth checks the tokens of every request.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from omnivoice.server.auth.keys import ANONYMOUS
from omnivoice.server.auth.principal import principal_of
from omnivoice.server.errors import bad_request, read_json_object
from omnivoice.server.realtime import protocol as p
from omnivoice.server.realtime.server_events import session_object
from omnivoice.server.realtime.session_config import SessionPatch, SessionSettings, SettingsError, apply_patch

PREFIX = "ek_"
SUBPROTOCOL_PREFIX = "openai-insecure-api-key."
DEFAULT_TTL_S = 600  # OpenAI's default


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ExpiresAfter(_Strict):
    anchor: Literal["created_at"] = "created_at"
    seconds: int = Field(DEFAULT_TTL_S, ge=10, le=7200)


class ClientSecretRequest(_Strict):
    expires_after: ExpiresAfter | None = None
    session: dict[str, Any] | None = None


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


async def create_client_secret(request: Request) -> Response:
    """`POST /v1/realtime/client_secrets {expires_after?: {anchor, seconds}, session?}` ->
    `{value: "ek_...", expires_at, session}`; the session settings are checked now, not at use."""
    state = request.app.state
    body = await read_json_object(request, state.profile.server.max_body_bytes)
    try:
        req = ClientSecretRequest.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        param = ".".join(str(x) for x in first["loc"]) or None
        raise bad_request(f"Invalid value for '{param}': {first['msg']}.", param=param) from None
    info = state.lifecycle.require().info
    settings = _check_session(req.session or {}, info.voices, info.default_voice)
    ttl_s = req.expires_after.seconds if req.expires_after else DEFAULT_TTL_S
    secret = state.realtime.secrets.issue(req.session or {}, ttl_s, owner=principal_of(request).owner)
    session = session_object(settings, "", info.served_name, beta=False)
    del session["id"]  # a session id is made for each session opened with the secret
    session["expires_at"] = int(secret.expires_at)
    return JSONResponse({"value": secret.value, "expires_at": int(secret.expires_at), "session": session})


def _check_session(session: dict[str, Any], voices: tuple[str, ...], default_voice: str) -> SessionSettings:
    try:
        patch = SessionPatch.model_validate(session)
        return apply_patch(SessionSettings(voice=default_voice), patch, voices, default_voice)
    except ValidationError as e:
        err = p.session_patch_error(e, None)
        raise bad_request(err.message, param=err.param, code=err.code) from None
    except SettingsError as e:
        raise bad_request(str(e), param=e.param, code="invalid_value") from None
