"""CUDA MPS for stage processes that share a GPU (engine/mps.py), with a stand-in for
nvidia-cuda-mps-control on PATH (this machine has no GPU and no MPS): which devices are shared, a
daemon of the pipeline's own started in the run directory and quit at its stop, one already running
used as it is, a daemon left by a pipeline that died quit at the next start, and what `auto` and `on`
do when none can be started."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import stat
import sys
from pathlib import Path

import pytest

from omnivoice.config import StagesConfig, parse_profile
from omnivoice.engine.mps import (
    LOG_ENV,
    PIPE_ENV,
    MpsUnavailable,
    daemon_processes,
    mps_client,
    mps_root,
    shared_devices,
    start_mps,
)
from omnivoice.engine.pipeline import Pipeline, PipelineStartError
from omnivoice.engine.process_stats import start_time

# the stand-in: `-d` makes the control socket (a plain file here) in the pipe directory, `quit` on
# stdin removes it; each command is written to the journal. FAIL_MPS makes `-d` fail as a driver
# without MPS support does. MPS_LINGER=<s> leaves a daemon process running with the environment it
# was given (its pid in the journal), as the real daemon does; told to quit, it exits <s> later, as the
# real one ends only once its server has; MPS_LINGER=never: it does not exit.
CONTROL = f"""#!{sys.executable}
import os, pathlib, subprocess, sys
DAEMON = '''
import pathlib, sys, time
control, linger = pathlib.Path(sys.argv[1]), sys.argv[2]
while control.exists():
    time.sleep(0.02)
while linger == "never":
    time.sleep(1)
time.sleep(float(linger))
'''
pipe = pathlib.Path(os.environ.get("{PIPE_ENV}", "/tmp/nvidia-mps"))
journal = pathlib.Path(os.environ["MPS_JOURNAL"])
if sys.argv[1:] == ["-d"]:
    if os.environ.get("FAIL_MPS"):
        print("An MPS control daemon cannot be started on this system")
        sys.exit(1)
    (pipe / "control").write_text("")
    with journal.open("a") as j:
        j.write(f"start {{pipe}} {{os.environ.get('{LOG_ENV}')}}\\n")
    if linger := os.environ.get("MPS_LINGER"):
        daemon = subprocess.Popen(
            [sys.executable, "-c", DAEMON, str(pipe / "control"), linger],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        with journal.open("a") as j:
            j.write(f"daemon {{daemon.pid}}\\n")
else:
    command = sys.stdin.read().strip()
    (pipe / "control").unlink(missing_ok=True)
    with journal.open("a") as j:
        j.write(f"{{command}} {{pipe}}\\n")
"""


def stages(**overrides: object) -> StagesConfig:
    cuda = {"device": "cuda:0", "worker": "process"}
    body = {name: dict(cuda) for name in ("thinker", "talker", "code2wav")}
    for key, value in overrides.items():
        if key in body:
            body[key] = {**body[key], **value}  # type: ignore[dict-item]
        else:
            body[key] = value  # type: ignore[assignment]
    return parse_profile({"stages": body}).stages


@pytest.fixture
def mps_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in on PATH, a run directory of the test's own; the journal's path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    program = bin_dir / "nvidia-cuda-mps-control"
    program.write_text(CONTROL)
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    journal = tmp_path / "journal"
    journal.write_text("")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("MPS_JOURNAL", str(journal))
    monkeypatch.setenv("OMNIVOICE_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.delenv(PIPE_ENV, raising=False)
    monkeypatch.delenv(LOG_ENV, raising=False)
    return journal


def test_a_device_is_shared_when_two_stage_processes_run_on_it() -> None:
    assert shared_devices(stages()) == ["cuda:0"]
    assert shared_devices(stages(code2wav={"device": "cuda:1"})) == ["cuda:0"]
    assert shared_devices(stages(talker={"device": "cuda:1"}, code2wav={"device": "cuda:2"})) == []
    # a thread is not a process of its own: it shares its process's context, not the GPU's slices
    assert shared_devices(stages(talker={"worker": "thread"}, code2wav={"worker": "thread"})) == []
    assert shared_devices(parse_profile({}).stages) == []  # the CPU default
    two = stages(talker={"device": "cuda:1", "replicas": 2}, code2wav={"device": "cuda:2"})
    assert shared_devices(two) == ["cuda:1"]  # two replicas of one stage on one device


def test_the_pipelines_own_daemon_is_started_in_the_run_directory_and_quit_at_its_stop(
    mps_env: Path,
) -> None:
    daemon = start_mps(stages())
    assert daemon is not None and daemon.owned
    env = daemon.env()
    pipe = Path(env[PIPE_ENV])
    assert pipe.parent.parent == mps_root() and (pipe / "control").exists()
    assert Path(env[LOG_ENV]).is_dir()
    assert mps_env.read_text().splitlines() == [f"start {pipe} {env[LOG_ENV]}"]
    assert PIPE_ENV not in os.environ  # the stage processes get it; this process is no client
    daemon.stop()
    assert mps_env.read_text().splitlines()[1:] == [f"quit {pipe}"]
    assert not pipe.parent.exists()


def test_a_quit_returns_once_the_daemons_processes_have_exited(
    mps_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MPS_LINGER", "0.5")
    daemon = start_mps(stages())
    assert daemon is not None
    pid = _daemon_pid(mps_env)
    assert daemon_processes(Path(daemon.env()[PIPE_ENV])) == [pid]
    daemon.stop()
    assert start_time(pid) is None  # gone before the stop returned: a next pipeline starts beside no old one


def test_a_daemon_that_does_not_exit_is_waited_for_no_longer_than_the_limit(
    mps_env: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("MPS_LINGER", "never")
    monkeypatch.setattr("omnivoice.engine.mps.QUIT_TIMEOUT_S", 0.3)
    daemon = start_mps(stages())
    assert daemon is not None and daemon.home is not None
    pid = _daemon_pid(mps_env)
    try:
        with caplog.at_level(logging.WARNING, logger="omnivoice.engine.mps"):
            daemon.stop()
        assert start_time(pid) is not None
        assert f"still runs 0 s after it was told to quit (pids {pid})" in caplog.text
        assert not daemon.home.exists()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _daemon_pid(journal: Path) -> int:
    [pid] = [int(line.split()[1]) for line in journal.read_text().splitlines() if line.startswith("daemon ")]
    return pid


def test_a_daemon_already_running_is_used_and_left_running(
    mps_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    theirs = tmp_path / "operator-mps"
    theirs.mkdir()
    (theirs / "control").write_text("")
    monkeypatch.setenv(PIPE_ENV, str(theirs))
    daemon = start_mps(stages())
    assert daemon is not None and not daemon.owned
    assert daemon.env() == {PIPE_ENV: str(theirs)}
    daemon.stop()
    assert mps_env.read_text() == "" and (theirs / "control").exists()  # never started, never quit


def test_a_daemon_left_by_a_pipeline_that_died_is_quit_at_the_next_start(mps_env: Path) -> None:
    # named after a process that is gone: this pid with another start time
    left = mps_root() / f"{os.getpid()}-1" / "pipe"
    left.mkdir(parents=True)
    (left / "control").write_text("")
    daemon = start_mps(stages())
    assert daemon is not None
    assert f"quit {left}" in mps_env.read_text().splitlines()
    assert not left.parent.exists()
    daemon.stop()


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"PATH": "/nonexistent"}, "no nvidia-cuda-mps-control on PATH"),
        ({"FAIL_MPS": "1"}, "cannot be started on this system"),  # what the program printed
    ],
    ids=["no-program", "it-fails"],
)
def test_without_a_daemon_auto_warns_and_on_refuses_to_start(
    mps_env: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    env: dict[str, str],
    why: str,
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with caplog.at_level(logging.WARNING, logger="omnivoice.engine.mps"):
        assert start_mps(stages()) is None
    assert why in caplog.text and "time slices" in caplog.text
    with pytest.raises(MpsUnavailable, match=why):
        start_mps(stages(mps="on"))
    assert not mps_root().exists() or not any(mps_root().iterdir())  # nothing left behind


def test_off_or_nothing_shared_starts_no_daemon(mps_env: Path) -> None:
    assert start_mps(stages(mps="off")) is None
    assert start_mps(stages(talker={"device": "cuda:1"}, code2wav={"device": "cuda:2"}, mps="on")) is None
    assert mps_env.read_text() == ""


def test_a_run_directory_too_long_for_a_socket_falls_back_to_a_short_one(
    mps_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = tmp_path / ("d" * 100)
    monkeypatch.setenv("OMNIVOICE_RUN_DIR", str(deep))
    root = mps_root()
    assert not str(root).startswith(str(deep)) and str(os.getuid()) in root.name
    daemon = start_mps(stages())
    assert daemon is not None and len(os.fsencode(daemon.pipe / "control")) < 108
    daemon.stop()
    assert f"quit {daemon.pipe}" in mps_env.read_text()
    with contextlib.suppress(OSError):  # the system's temporary directory: leave it as it was
        root.rmdir()


def test_a_gpu_process_with_the_daemons_pipe_in_its_environment_is_a_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(PIPE_ENV, raising=False)
    assert not mps_client("cuda:0")
    monkeypatch.setenv(PIPE_ENV, "/tmp/some-mps")
    assert mps_client("cuda:0") and mps_client("cuda")
    assert not mps_client("cpu") and not mps_client(None)  # a CPU stage is nobody's client


def test_a_pipeline_that_needs_mps_and_gets_none_fails_to_start_before_any_stage_process(
    mps_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    cuda = {"device": "cuda:0", "worker": "process"}
    profile = parse_profile({"stages": {"mps": "on", "thinker": cuda, "talker": cuda, "code2wav": cuda}})
    with pytest.raises(PipelineStartError, match=r"stages\.mps is on"):
        Pipeline.start(profile, tmp_path / "no-checkpoint")  # never read: nothing started
