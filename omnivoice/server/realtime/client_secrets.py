"""`POST /v1/realtime/client_secrets`: mint a short-lived client secret for a browser or mobile app.

`{expires_after?: {anchor, seconds}, session?}` -> `{value: "ek_...", expires_at, session}`, OpenAI's
shape. The session settings are checked now, not when a session opens with the secret. Minting one
needs an API key (when the server has keys); the secret is charged to that key. The store, and how
requests present a secret, are auth's (omnivoice.server.auth.client_secrets).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from omnivoice.server.auth.principal import principal_of
from omnivoice.server.errors import bad_request, read_json_object
from omnivoice.server.fleet.answers import share_secret
from omnivoice.server.json_bounds import JsonBounds
from omnivoice.server.session import protocol as p
from omnivoice.server.session.server_events import session_object
from omnivoice.server.session.session_config import SessionPatch, SessionSettings, SettingsError, apply_patch

DEFAULT_TTL_S = 600  # OpenAI's default


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ExpiresAfter(_Strict):
    anchor: Literal["created_at"] = "created_at"
    seconds: int = Field(DEFAULT_TTL_S, ge=10, le=7200)


class ClientSecretRequest(_Strict):
    expires_after: ExpiresAfter | None = None
    session: dict[str, Any] | None = None


async def create_client_secret(request: Request) -> Response:
    """`POST /v1/realtime/client_secrets {expires_after?: {anchor, seconds}, session?}` ->
    `{value: "ek_...", expires_at, session}`; the session settings are checked now, not at use."""
    state = request.app.state
    s = state.profile.server
    body = await read_json_object(
        request, s.max_body_bytes, JsonBounds(s.max_json_elements, s.max_json_depth)
    )
    try:
        req = ClientSecretRequest.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        param = ".".join(str(x) for x in first["loc"]) or None
        raise bad_request(f"Invalid value for '{param}': {first['msg']}.", param=param) from None
    info = state.lifecycle.require().info
    settings = _check_session(req.session or {}, info.voices, info.default_voice)
    ttl_s = req.expires_after.seconds if req.expires_after else DEFAULT_TTL_S
    secret = state.auth.secrets.issue(req.session or {}, ttl_s, owner=principal_of(request).owner)
    await share_secret(state.fleet, secret)  # a session may open with it on any front end
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
