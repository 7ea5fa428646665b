"""`omnivoice serve` starts the engine core of a `stages.core: process` profile before it imports its
own stack (engine/core/launch.py): the launch imports no torch or transformers, the server takes the
launched core over (one core, generation 1, serving requests), and a core no server took is stopped."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from omnivoice.config import load_profile
from omnivoice.engine.core.launch import CoreLaunch
from tests.support.serve_process import ServeProcess, write_profile

THREADS = {"max_seq_len": 1024, "worker": "thread"}


def _profile(tmp_path: Path, checkpoint: Path, port: int = 0) -> Path:
    stages = {"core": "process", "thinker": THREADS, "talker": THREADS, "code2wav": THREADS}
    stages["capacity"] = {"enabled": False}
    return write_profile(tmp_path, checkpoint, server={"port": port}, stages=stages)


def test_the_launch_imports_neither_torch_nor_transformers() -> None:
    code = (
        "import sys, omnivoice.engine.core.launch; "
        "print(sorted(m for m in ('torch', 'transformers', 'starlette') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.mark.slow
def test_serve_starts_the_core_first_and_serves_from_it(tiny_checkpoint: Path, tmp_path: Path) -> None:
    server = ServeProcess(_profile(tmp_path, tiny_checkpoint))
    try:
        url = server.wait_ready(240)
        r = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": "omnivoice", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        log = server.log
        started = [line for line in server.lines if "engine core" in line and "started (pid" in line]
        assert len(started) == 1 and "engine core 1 started" in started[0], log[-3000:]
        assert log.index("engine core 1 started") < log.index("Started server process"), log[-3000:]
    finally:
        server.kill()


@pytest.mark.slow
def test_a_server_that_cannot_bind_ends_with_its_core(tiny_checkpoint: Path, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = ServeProcess(_profile(tmp_path, tiny_checkpoint, port))
        try:
            assert server.proc.wait(200) != 0  # it closes the engine once started
            assert server.wait_log_closed(60), "the core (or what it started) outlived the server"
            assert "engine core 1 started" in server.log
        finally:
            server.kill()


@pytest.mark.slow
def test_a_launch_no_client_took_is_stopped_and_a_taken_one_is_left_to_its_client(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    profile = load_profile(_profile(tmp_path, tiny_checkpoint))
    untaken = CoreLaunch.begin(profile)
    assert untaken.source == tiny_checkpoint
    untaken.close(timeout=2.0)
    assert not untaken.handle.process.is_alive()
    with pytest.raises(RuntimeError, match="already taken"):
        untaken.take()

    taken = CoreLaunch.begin(profile).take()
    try:
        taken.close(timeout=2.0)  # its client owns it now: left running
        assert taken.handle.process.is_alive()
    finally:
        taken.handle.stop(2.0)
    assert not taken.handle.process.is_alive()
