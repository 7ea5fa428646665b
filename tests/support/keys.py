"""A real server (fake engine) with API keys, listening as `omnivoice serve` does
(omnivoice.server.listener), and how clients present a key."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import openai

from omnivoice.config import parse_profile
from omnivoice.server import create_app
from omnivoice.server.auth.keys import ApiKeys
from omnivoice.server.listener import server_config

from .fake_engine import FakeEngine, FakeServer
from .serve import serve

KEY = "sk-omnivoice-test-7f3a9c1e5b2d4a6f8e0c"
OTHER_KEY = "sk-omnivoice-other-1b2c3d4e5f60718293"


@contextmanager
def serve_keyed(keys: tuple[str, ...] = (KEY, OTHER_KEY), **sections: Any) -> Iterator[FakeServer]:
    """The fake engine behind a real uvicorn server with these API keys and profile sections, configured
    as `omnivoice serve` configures it. Failed attempts are not throttled unless `auth` says so (the
    tests fail on purpose, all from loopback)."""
    sections["auth"] = {"max_failed_auth_per_minute": None, **sections.get("auth", {})}
    engines: list[FakeEngine] = []
    profile = parse_profile(sections)
    app = create_app(profile, FakeEngine.factory(engines=engines), api_keys=ApiKeys(keys))
    with serve(app, config=server_config(app, profile, "127.0.0.1", 0, None)) as url:
        yield FakeServer(url, app, engines)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def ws_url(url: str) -> str:
    return url.replace("http://", "ws://") + "/v1/realtime?model=omnivoice"


def sdk(url: str, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
