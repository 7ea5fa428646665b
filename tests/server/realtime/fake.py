"""A real uvicorn server over the fake engine, with realtime settings, for protocol tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import openai

from omnivoice.config import parse_profile
from omnivoice.server import create_app
from tests.support.fake_engine import FakeEngine, FakeServer, Script
from tests.support.serve import serve


@contextmanager
def serve_realtime(script: Script | None = None, **realtime: Any) -> Iterator[FakeServer]:
    profile = parse_profile({"realtime": realtime})
    engines: list[FakeEngine] = []
    app = create_app(profile, FakeEngine.factory(script, engines=engines))
    with serve(app) as url:
        yield FakeServer(url, app, engines)


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
