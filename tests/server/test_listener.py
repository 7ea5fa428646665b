"""`omnivoice serve`'s uvicorn configuration: X-Forwarded-For is believed from server.trusted_proxies
only (uvicorn believes loopback by default), so rotating it cannot dodge the failed-auth limiter."""

from __future__ import annotations

import httpx

from tests.support.keys import bearer, serve_keyed


def failed_attempts(url: str, n: int) -> list[int]:
    """The statuses of `n` wrong keys, each sent as from another address."""
    return [
        httpx.get(
            f"{url}/v1/models", headers={**bearer("sk-wrong"), "X-Forwarded-For": f"203.0.113.{i}"}
        ).status_code
        for i in range(n)
    ]


def test_forwarded_for_is_ignored_by_default() -> None:
    with serve_keyed(auth={"max_failed_auth_per_minute": 3}) as s:
        assert failed_attempts(s.url, 5) == [401, 401, 401, 429, 429]


def test_forwarded_for_is_believed_from_trusted_proxies() -> None:
    auth = {"max_failed_auth_per_minute": 3}
    with serve_keyed(auth=auth, server={"trusted_proxies": ["127.0.0.1"]}) as s:
        assert failed_attempts(s.url, 5) == [401] * 5  # five clients behind the proxy, one failure each
