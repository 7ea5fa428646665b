"""Run an ASGI app under a real uvicorn server on a loopback ephemeral port, in a background thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.types import ASGIApp


class ServerThread:
    """uvicorn in its own thread and event loop; `base_url` is known once `start()` returns. `config`
    (e.g. omnivoice.server.listener.server_config's, on 127.0.0.1 port 0) replaces the plain one."""

    def __init__(self, app: ASGIApp, config: uvicorn.Config | None = None) -> None:
        config = config or uvicorn.Config(
            app, host="127.0.0.1", port=0, lifespan="on", log_config=None, access_log=False,
            timeout_graceful_shutdown=5,
        )  # fmt: skip
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn-test", daemon=True)
        self.base_url = ""

    def start(self, timeout: float = 30.0) -> str:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("uvicorn exited during startup")
            if time.monotonic() > deadline:
                raise TimeoutError("uvicorn did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}"
        return self.base_url

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise RuntimeError("uvicorn did not stop")


@contextmanager
def serve_thread(
    app: ASGIApp, *, wait_healthy: float | None = 30.0, config: uvicorn.Config | None = None
) -> Iterator[ServerThread]:
    """Serve `app`, yield its ServerThread, stop it on exit; waits for /health 200 unless None."""
    st = ServerThread(app, config)
    st.start()
    try:
        if wait_healthy is not None:
            wait_until_healthy(st.base_url, wait_healthy)
        yield st
    finally:
        st.stop()


@contextmanager
def serve(
    app: ASGIApp, *, wait_healthy: float | None = 30.0, config: uvicorn.Config | None = None
) -> Iterator[str]:
    """As `serve_thread`, yielding the base URL."""
    with serve_thread(app, wait_healthy=wait_healthy, config=config) as st:
        yield st.base_url


def wait_until_healthy(base_url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = httpx.get(f"{base_url}/health", timeout=5)
        if last.status_code == 200:
            return
        if last.json().get("status") == "failed":
            raise RuntimeError(f"engine failed to start: {last.text}")
        time.sleep(0.05)
    raise TimeoutError(f"server not healthy after {timeout} s: {last.text if last else None}")


@contextmanager
def serve_tiny(checkpoint: Path, worker: str = "thread", **sections: Any) -> Iterator[ServerThread]:
    """The tiny model behind a real uvicorn server on loopback; thread workers (the default) start
    quickest, `worker="process"` runs each stage in its own process (shared-memory connectors).

    `sections` adds profile sections (e.g. `realtime={"max_buffer_seconds": 30}`). Admission from
    measured capacity is off unless `stages` is given: what a loaded machine measures must not refuse
    the streams of tests of other behaviour (tests/server/test_measured_capacity.py tests it).
    """
    from omnivoice.config import parse_profile
    from omnivoice.server import create_app

    stage = {"worker": worker, "max_seq_len": 1024, "max_batch": 4}
    stages = {"thinker": stage, "talker": stage, "code2wav": stage, "capacity": {"enabled": False}}
    profile = parse_profile({"model": {"path": str(checkpoint)}, "stages": stages, **sections})
    with serve_thread(create_app(profile), wait_healthy=300) as st:
        yield st
