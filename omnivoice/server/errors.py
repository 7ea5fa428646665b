"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, and reading JSON bodies.

Routes raise `APIError` (usually through the helpers below); the handlers installed by `create_app`
turn it, Starlette's routing errors (404/405) and unexpected exceptions into that shape, so the
`openai` SDK maps every failure to its typed exceptions (`BadRequestError`, `RateLimitError`, ...).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from omnivoice.server.json_bounds import JsonBounds

log = logging.getLogger(__name__)

CLIENT_CLOSED_REQUEST = 499  # the access log's status for a request whose client left mid-body


_INLINE_BYTES = 1 << 20  # bodies larger than this are parsed in a worker thread


class APIError(Exception):
    """An error returned to the client as-is; `message` is user-facing."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def not_found(message: str, *, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(404, message, param=param, code=code)


def method_not_allowed(message: str) -> APIError:
    return APIError(405, message, code="method_not_allowed")


def payload_too_large(limit: int) -> APIError:
    return APIError(413, f"request body is larger than {limit} bytes", code="request_too_large")


def unprocessable(message: str, *, param: str | None = None) -> APIError:
    return APIError(422, message, param=param)


def too_many_requests(limit: int) -> APIError:
    message = f"server is at its limit of {limit} concurrent requests; retry later"
    return APIError(
        429, message, type="rate_limit_error", code="too_many_requests", headers={"Retry-After": "1"}
    )


def rate_limited(message: str, retry_after_s: int) -> APIError:
    """Over a per-key limit (auth.rate_limit): 429 with the seconds to wait."""
    return APIError(
        429, message, type="rate_limit_error", code="rate_limit_exceeded",
        headers={"Retry-After": str(retry_after_s)},
    )  # fmt: skip


def server_overloaded(message: str) -> APIError:
    """The server is at capacity (concurrent requests, a full engine stage): 503, retry shortly."""
    return APIError(503, message, type="server_error", code="server_overloaded", headers={"Retry-After": "1"})


def shutting_down() -> APIError:
    """The server is draining before it exits (SIGTERM): 503, retry on another instance."""
    message = "the server is shutting down; retry shortly"
    return APIError(
        503, message, type="server_error", code="server_shutting_down",
        headers={"Retry-After": "5", "Connection": "close"},
    )  # fmt: skip


def request_timeout(timeout_s: float) -> APIError:
    """The request's body did not arrive in time (server.body_timeout_s): 408, and the connection ends."""
    message = f"the request body did not arrive within {timeout_s:g} s"
    return APIError(408, message, code="request_timeout", headers={"Connection": "close"})


def internal_error(message: str = "internal server error") -> APIError:
    return APIError(500, message, type="server_error")


def service_unavailable(message: str) -> APIError:
    return APIError(
        503, message, type="server_error", code="service_unavailable", headers={"Retry-After": "5"}
    )


async def read_json_object(
    request: Request, max_bytes: int, bounds: JsonBounds | None = None
) -> dict[str, Any]:
    """The request's JSON object body, enforcing content type and size (and the values and nesting
    `bounds` allow: 413 past them) before parsing; a large body is parsed in a worker thread."""
    ctype = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if ctype != "application/json" and not ctype.endswith("+json"):
        raise bad_request(
            f"Content-Type must be application/json, got {ctype!r}", code="invalid_content_type"
        )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise payload_too_large(max_bytes)
    body = bytearray()
    async for chunk in request.stream():  # also bounds chunked uploads that send no Content-Length
        body += chunk
        if len(body) > max_bytes:
            raise payload_too_large(max_bytes)
    why = bounds.size_error(body) if bounds is not None else None
    if why is not None:
        raise APIError(413, f"the request body is too complex: {why}", code="json_too_complex")
    data = await asyncio.to_thread(_parse, body) if len(body) > _INLINE_BYTES else _parse(body)
    why = bounds.depth_error(data) if bounds is not None else None
    if why is not None:
        raise APIError(413, f"the request body is too complex: {why}", code="json_too_complex")
    if not isinstance(data, dict):
        raise bad_request("the request body must be a JSON object", code="invalid_json")
    return data


def _parse(body: bytes | bytearray) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise bad_request(f"could not parse the JSON body of the request: {e}", code="invalid_json") from None


async def _api_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    if exc.status >= 500:
        log.warning("request %s failed: %s %s", _rid(request), exc.status, exc.message)
    return exc.response()


async def _http_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        err = not_found(f"no route for {request.method} {request.url.path}", code="not_found")
    elif exc.status_code == 405:
        err = method_not_allowed(f"method {request.method} is not allowed on {request.url.path}")
    else:
        err = APIError(exc.status_code, str(exc.detail), type="invalid_request_error")
    if exc.headers:
        err.headers = {**exc.headers, **(err.headers or {})}
    return err.response()


async def _client_gone_handler(request: Request, exc: Exception) -> Response:
    # the client left while sending its body: nothing went wrong here, and no one reads the answer
    log.info("request %s: the client disconnected before its body was complete", _rid(request))
    return Response(status_code=CLIENT_CLOSED_REQUEST)


async def _unexpected_error_handler(request: Request, exc: Exception) -> Response:
    log.error("request %s failed with an unexpected error", _rid(request), exc_info=exc)
    return internal_error().response()


def _rid(request: Request) -> str:
    return str(request.scope.get("state", {}).get("request_id", "-"))


EXCEPTION_HANDLERS = {
    APIError: _api_error_handler,
    HTTPException: _http_error_handler,
    ClientDisconnect: _client_gone_handler,
    Exception: _unexpected_error_handler,
}
