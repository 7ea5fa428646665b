"""A real server's log stays one line per record when clients put CR/LF in what they send: a path,
a WebSocket's path and query string (logged by uvicorn and by the session)."""

from __future__ import annotations

import io
import json

import httpx
import pytest
import websockets

from omnivoice.logs import configure_logging
from tests.support.keys import serve_keyed

FORGED = "%0D%0A2030-01-01%2000:00:00.000%20INFO%20FORGED"


async def test_what_clients_send_cannot_forge_log_lines() -> None:
    buf = io.StringIO()
    configure_logging("info", buf)
    with serve_keyed(keys=()) as s:
        assert httpx.get(f"{s.url}/v1/models{FORGED}").status_code == 404  # the access log has the path
        ws = s.url.replace("http", "ws")
        with pytest.raises(websockets.exceptions.InvalidStatus):  # uvicorn logs the refused path
            async with websockets.connect(f"{ws}/v1/realtime{FORGED}", origin="https://evil.example"):  # type: ignore[arg-type]
                pass
        async with websockets.connect(f"{ws}/v1/realtime?model=omnivoice{FORGED}") as conn:
            assert json.loads(await conn.recv())["type"] == "session.created"  # the session logs the model
    text = buf.getvalue()
    assert text.count("\\r\\n2030-01-01") >= 3  # logged, escaped
    assert not [line for line in text.splitlines() if line.startswith("2030")]
