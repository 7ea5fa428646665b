"""The server the hostile probes attack: `python -m omnivoice serve` in a process of its own (the tiny
model, thread stages, the default limits), so that what a probe measures (its `/health` latency, its
memory) is the server's, not the test client's sharing one interpreter with it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.serve_process import ServeProcess, write_profile


@pytest.fixture(scope="session")
def hostile_server(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    folder = tmp_path_factory.mktemp("hostile")
    server = ServeProcess(write_profile(folder, tiny_checkpoint, worker="thread"))
    try:
        server.base_url = server.wait_ready(300)  # type: ignore[attr-defined]
        yield server
    finally:
        server.kill()


def url_of(server: ServeProcess) -> str:
    return server.base_url  # type: ignore[attr-defined,no-any-return]
