"""Stage processes never outlive the process that started them, spawned or forked from the forkserver.

They ignore SIGTERM and SIGINT (the server stops them), so a process that exits without stopping its
stages must end them itself: multiprocessing's exit handler would signal them with SIGTERM and then
wait for them forever. A server killed with SIGKILL takes them along: they watch the pipe from the
server, not their parent's pid (a forked one's parent is the forkserver). The forkserver ends with
the server too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from omnivoice.engine.process_stats import start_time
from tests.support.polling import wait_until
from tests.support.serve_process import alive, forkservers, running

ROOT = Path(__file__).resolve().parents[2]

START = textwrap.dedent(
    """
    import os
    import sys
    from pathlib import Path

    from omnivoice.config import parse_profile
    from omnivoice.engine.pipeline import Pipeline
    from tests.support.serve_process import forkservers

    checkpoint = Path(sys.argv[1])
    stage = {"max_seq_len": 256, "max_batch": 2}
    profile = parse_profile({
        "model": {"path": str(checkpoint)},
        "stages": {
            "thinker": {**stage, "worker": "process"},
            "talker": {**stage, "worker": "thread"},
            "code2wav": {**stage, "worker": "thread"},
            "start_method": sys.argv[2],
        },
    })
    pipe = Pipeline.start(profile, checkpoint)
    print("worker", pipe.processes[0].pid, flush=True)
    print("forkservers", *forkservers(os.getpid()), flush=True)
    """
)
EXIT = START + "sys.exit(0)  # without pipe.stop(), as a server whose shutdown failed or never ran\n"
WAIT = START + "sys.stdin.read()  # until the test kills this process\n"


def pids(line: str) -> list[int]:
    return [int(p) for p in line.split()[1:]]


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_process_that_exits_without_stopping_its_stages_ends_them(
    tiny_checkpoint: Path, tmp_path: Path, method: str
) -> None:
    env = {**os.environ, "OMNIVOICE_RUN_DIR": str(tmp_path / "run")}
    done = subprocess.run(
        [sys.executable, "-c", EXIT, str(tiny_checkpoint), method],
        capture_output=True, text=True, env=env, timeout=180, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = {line.split()[0]: pids(line) for line in done.stdout.splitlines()}
    [worker] = lines["worker"]
    assert not alive(worker)  # killed and reaped before the script exited
    assert not list((tmp_path / "run").glob("*.json"))
    assert len(lines["forkservers"]) == (method == "forkserver"), lines
    gone = lambda: not any(alive(p) for p in lines["forkservers"])  # noqa: E731
    wait_until(gone, 30, what="the forkserver ending once the process that started it has")


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_killed_server_takes_its_stage_processes_and_forkserver_along(
    tiny_checkpoint: Path, tmp_path: Path, method: str
) -> None:
    env = {**os.environ, "OMNIVOICE_RUN_DIR": str(tmp_path / "run")}
    server = subprocess.Popen(
        [sys.executable, "-c", WAIT, str(tiny_checkpoint), method],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    left: dict[int, int] = {}
    try:
        assert server.stdout is not None
        worker = pids(server.stdout.readline())
        servers = pids(server.stdout.readline())
        assert worker and len(servers) == (method == "forkserver")
        left = {p: t for p, t in forkservers(server.pid).items() if p in servers}
        left |= {p: t for p in worker if (t := start_time(p)) is not None}
        assert len(left) == len(worker) + len(servers), left
        if method == "forkserver":  # forked: the stage process's parent is the forkserver
            assert _parent(worker[0]) == servers[0]
        os.kill(server.pid, signal.SIGKILL)
        server.wait(30)
        wait_until(lambda: not running(left), 30, what="the stage process and the forkserver ending")
    finally:
        server.kill()
        server.wait()
        for pid, started in left.items():  # what a failed test left (never a reused pid)
            if start_time(pid) == started:
                os.kill(pid, signal.SIGKILL)


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


class _Flushed:
    def flush(self) -> None:
        pass


def _queue_then_exit(names: Any, parent: int) -> None:
    import multiprocessing as mp

    from omnivoice.engine.stage_process import exit_process

    q = mp.get_context("spawn").Queue()
    q.put("in flight")  # its feeder thread runs
    names.send([lock._semlock.name for lock in (q._rlock, q._wlock, q._sem)])  # type: ignore[attr-defined]
    exit_process(0, _Flushed(), parent)


def test_a_process_that_ends_with_exit_process_unlinks_its_semaphores() -> None:
    """The queues an engine core makes for its stages hold named semaphores; exit_process skips the
    interpreter's teardown, and the server's resource tracker would report them leaked."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    mine, theirs = ctx.Pipe()
    proc = ctx.Process(target=_queue_then_exit, args=(theirs, os.getpid()))
    proc.start()
    names = mine.recv()
    proc.join(60)
    assert proc.exitcode == 0
    assert len(names) == 3 and all(names)
    left = [n for n in names if Path("/dev/shm", "sem." + n.lstrip("/")).exists()]
    assert left == [], left
