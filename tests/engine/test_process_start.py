"""Stage processes forked from the preloaded forkserver (engine/process_start.py): they start with the
stage code imported and no device touched, take the server's environment of the moment rather than
the forkserver's, know the server by the pipe from it (their parent is the forkserver), and the
forkserver outlives a SIGTERM. Were it killed anyway, the stage processes it forked count as ended
and the pipeline's stop kills them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from multiprocessing.context import ForkServerContext
from pathlib import Path
from typing import Any

import pytest

from omnivoice.config import StagesConfig, parse_profile
from omnivoice.engine.pipeline import Pipeline
from omnivoice.engine.process_start import forkserver_cuda_check, stage_context, start_forkserver
from omnivoice.engine.process_stats import start_time
from tests.support.forkserver_probe import POISONED_CALL_SITE, PROBED, probe
from tests.support.polling import wait_until

FORKED = StagesConfig(start_method="forkserver", thinker={"worker": "process"})
VARIABLE = "OMNIVOICE_PROBE_SET_LATE"
ROOT = Path(__file__).parents[2]


def probed(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """Start the probe from the stages' context and return its report."""
    ctx = stage_context(FORKED)
    out = ctx.Queue()
    p = ctx.Process(target=probe, args=(out, os.getpid(), VARIABLE, environ or dict(os.environ)))
    p.start()
    try:
        report: dict[str, Any] = out.get(timeout=120)
    finally:
        p.join(30)
    assert p.exitcode == 0
    return report


def test_a_forked_process_has_the_stage_code_and_the_servers_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    start_forkserver(FORKED)  # (already running if another test of this process started it)
    monkeypatch.setenv(VARIABLE, "set after the forkserver started")
    report = probed()
    assert report["imported"] == list(PROBED)  # preloaded: imported before the probe ran
    assert report["cuda_initialized"] is False
    assert report["ppid"] != os.getpid()  # its parent is the forkserver...
    assert report["started_by"] == os.getpid()  # ...the pipe from this process names this one
    assert report["server_alive"] is True
    assert report["before"] is None  # the forkserver's environment lacks what was set since
    assert report["after"] == "set after the forkserver started"


def test_the_forkserver_ignores_sigterm() -> None:
    forkserver = probed()["ppid"]
    os.kill(forkserver, signal.SIGTERM)  # systemd's stop reaches every process of the service
    assert probed()["ppid"] == forkserver  # the same forkserver forks the next process


@pytest.mark.timeout(300)
def test_the_stage_processes_of_a_killed_forkserver_are_ended_and_killed(tiny_checkpoint: Path) -> None:
    stage = {"max_seq_len": 256, "max_batch": 2, "worker": "thread"}
    stages = {"thinker": {**stage, "worker": "process"}, "talker": stage, "code2wav": stage}
    profile = parse_profile(
        {"model": {"path": str(tiny_checkpoint)}, "stages": {**stages, "start_method": "forkserver"}}
    )
    pipe = Pipeline.start(profile, tiny_checkpoint)
    try:
        [worker] = pipe.processes
        assert worker.pid is not None
        started = start_time(worker.pid)
        forkserver = int(Path(f"/proc/{worker.pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        os.kill(forkserver, signal.SIGKILL)
        # the exit of the stage process is learnt from the forkserver: with it gone, it counts as ended
        wait_until(pipe.dead_workers, 30, what="the stage process counted as ended")
        assert start_time(worker.pid) == started  # though it runs on
    finally:
        pipe.stop()
    wait_until(lambda: start_time(worker.pid) != started, 30, what="the stop killing it")
    assert probed()["ppid"] != forkserver  # the next process comes from a fresh forkserver


def test_a_forkserver_that_made_a_cuda_call_has_cuda_stages_spawned(tmp_path: Path) -> None:
    ctx = stage_context(FORKED)
    assert isinstance(ctx, ForkServerContext)
    assert forkserver_cuda_check(ctx) is None  # the real preload makes no CUDA call
    # a fresh interpreter: this one's forkserver, if running, keeps the preload it started with
    script = """
import logging, sys
from omnivoice.config import StagesConfig
from omnivoice.engine import process_start
logging.basicConfig(level=logging.WARNING, stream=sys.stdout)
cuda_stage = StagesConfig(start_method="forkserver", thinker={"worker": "process", "device": "cuda:0"})
cpu_stage = StagesConfig(start_method="forkserver", thinker={"worker": "process"})
process_start.PRELOAD = "tests.support.cuda_poisoned_preload"
print("cpu stages:", process_start.stage_context(cpu_stage).get_start_method())
print("cuda stages:", process_start.stage_context(cuda_stage).get_start_method())
"""
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).parents[2],
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "cpu stages: forkserver" in lines  # CPU stages need no check
    assert "cuda stages: spawn" in lines
    assert any("spawned, not forked" in line and POISONED_CALL_SITE in line for line in lines), out.stdout
