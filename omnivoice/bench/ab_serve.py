"""The two sides of an A/B benchmark: a git revision unpacked into its own directory, and its server
started on a free loopback port with that directory first on PYTHONPATH, then stopped."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

LOG_TAIL_LINES = 20  # of a server that did not come up, shown with the error


class ServeError(RuntimeError):
    """A revision's server did not come up (it exited or never answered /health with 200)."""


@dataclass(frozen=True)
class Revision:
    """A revision as asked for (`name`), the commit it names, and the directory holding its files."""

    name: str
    commit: str
    tree: Path


def resolve(repo: Path, name: str) -> str:
    """The full commit id `name` stands for in `repo` (raises ValueError if it names none)."""
    out = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise ValueError(f"{name!r} is not a commit in {repo}")
    return out.stdout.strip()


def materialise(repo: Path, name: str, parent: Path) -> Revision:
    """Unpack the files of revision `name` (`git archive`) into a new directory under `parent`; the
    repository itself and its worktrees are not touched."""
    commit = resolve(repo, name)
    tree = parent / commit[:12]
    if not tree.exists():
        tree.mkdir(parents=True)
        archive = subprocess.Popen(["git", "-C", str(repo), "archive", commit], stdout=subprocess.PIPE)
        assert archive.stdout is not None
        with tarfile.open(fileobj=archive.stdout, mode="r|") as tar:
            tar.extractall(tree, filter="data")
        if archive.wait() != 0:
            shutil.rmtree(tree, ignore_errors=True)
            raise ValueError(f"git archive {commit} failed")
    return Revision(name=name, commit=commit, tree=tree)


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tree_env(tree: Path) -> dict[str, str]:
    """This process's environment with `tree` alone on PYTHONPATH, so `omnivoice` is imported from it."""
    return {**os.environ, "PYTHONPATH": str(tree)}


def check_import(tree: Path, python: str = sys.executable) -> None:
    """Raise ServeError unless `python` imports the `omnivoice` package from `tree` (not an install)."""
    out = subprocess.run(
        [python, "-c", "import omnivoice; print(omnivoice.__file__)"],
        capture_output=True,
        text=True,
        env=tree_env(tree),
        cwd=tree,
    )
    where = Path(out.stdout.strip()).resolve() if out.returncode == 0 else None
    if where is None or tree.resolve() not in where.parents:
        raise ServeError(f"{python} imports omnivoice from {where or out.stderr.strip()}, not {tree}")


def _wait_ready(proc: subprocess.Popen[bytes], url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServeError(f"the server exited with code {proc.returncode} before it was ready")
        try:
            if httpx.get(f"{url}/health", timeout=5.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise ServeError(f"the server did not answer {url}/health with 200 within {timeout_s:.0f} s")


def _stop(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM to the server's process group (its stage processes too), SIGKILL after `grace_s`."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


@dataclass(frozen=True)
class Server:
    """A running server: its base URL and its pid, which is also its process group's id."""

    url: str
    pid: int


def group_cpu_by_process(pgid: int) -> dict[int, float]:
    """User + system CPU seconds used so far by each live process of process group `pgid`, by pid
    (Linux /proc; empty elsewhere). Less swayed by other work on a shared machine than wall time."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out: dict[int, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        # after the command: state, ppid, pgrp, ... utime and stime are the 12th and 13th
        if len(fields) > 12 and int(fields[2]) == pgid:
            out[int(stat.parent.name)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def group_cpu_seconds(pgid: int) -> float:
    """The sum of `group_cpu_by_process`."""
    return sum(group_cpu_by_process(pgid).values())


@contextmanager
def serving(
    rev: Revision,
    log_path: Path,
    profile: str | None = None,
    python: str = sys.executable,
    ready_timeout_s: float = 600.0,
) -> Iterator[Server]:
    """Run `omnivoice serve` from `rev`'s tree on a free port until the block ends; yields it.
    Its output goes to `log_path`. Raises ServeError if it does not become ready."""
    port = free_port()
    cmd = [python, "-m", "omnivoice", "serve", "--host", "127.0.0.1", "--port", str(port)]
    if profile is not None:
        cmd += ["--profile", profile]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=rev.tree,
            env=tree_env(rev.tree),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: stopped as a whole
        )
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            _wait_ready(proc, url, ready_timeout_s)
        except ServeError as e:
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:])
            raise ServeError(f"{e}; the end of its log:\n{tail}") from None
        yield Server(url, proc.pid)
    finally:
        _stop(proc, grace_s=30.0)
