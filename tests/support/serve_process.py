"""`python -m omnivoice serve` as a real process (its log read in the background), and the /proc
helpers tests use to find its stage processes (spawned, or forked by a forkserver) and see them end."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import yaml

from omnivoice.engine.process_stats import start_time


def descendants(pid: int) -> dict[int, int]:
    """Every process below `pid` (children, their children...), each with its start time: a pid whose
    process ends is soon reused on a busy machine, and the pid with its start time names one process."""
    parents: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry)] = (int(fields[1]), int(fields[19]))
    found: dict[int, int] = {}
    frontier = {pid}
    while frontier:
        frontier = {p for p, (parent, _) in parents.items() if parent in frontier} - found.keys()
        found |= {p: parents[p][1] for p in frontier}
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


FORKSERVER = b"multiprocessing.forkserver import main"


def forkservers(pid: int) -> dict[int, int]:
    """The multiprocessing forkservers below `pid` (the processes running one, not their children),
    each with its start time."""
    return {
        p: start
        for p, start in descendants(pid).items()
        if FORKSERVER in _cmdline(p) and FORKSERVER not in _cmdline(_parent(p) or 0)
    }


def stage_processes(pid: int) -> dict[int, int]:
    """The stage processes below `pid`, each with its start time, in the order they started: the
    processes multiprocessing spawned (not its resource tracker), or those a forkserver forked (a
    forkserver's child runs its command line)."""
    found = {}
    for p, start in sorted(descendants(pid).items(), key=lambda x: x[1::-1]):
        cmd = _cmdline(p)
        if b"spawn_main" in cmd or (FORKSERVER in cmd and FORKSERVER in _cmdline(_parent(p) or 0)):
            found[p] = start
    return found


def alive(pid: int) -> bool:
    """`pid` runs (a zombie, ended but not yet reaped, does not)."""
    return start_time(pid) is not None


def running(procs: dict[int, int]) -> list[str]:
    """Those of `procs` (pid: start time) still running, each as `pid state command line`."""
    found = []
    for pid, start in sorted(procs.items()):
        if start_time(pid) != start:
            continue
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        found.append(f"{pid} {state} {cmd[:160]}")
    return found


def write_profile(folder: Path, checkpoint: Path, worker: str = "process", **sections: Any) -> Path:
    """A profile YAML for the tiny model on a free port; `sections` add or replace profile sections.
    Admission from measured capacity is off unless `stages` is given (see `serve.serve_tiny`)."""
    stage = {"max_seq_len": 1024, "worker": worker}
    profile = {
        "model": {"path": str(checkpoint)},
        "server": {"port": 0},
        "stages": {"thinker": stage, "talker": stage, "code2wav": stage, "capacity": {"enabled": False}},
        **sections,
    }
    path = folder / f"profile-{worker}.yaml"
    path.write_text(yaml.safe_dump(profile))
    return path


class ServeProcess:
    """`python -m omnivoice serve --profile PATH` with its log read in the background.

    `env`: variables added to this process's environment; `own_group`: the server leads a process
    group of its own (so a signal to its group reaches its stage processes and nothing else)."""

    def __init__(self, profile: Path, env: dict[str, str] | None = None, own_group: bool = False) -> None:
        environ = {k: v for k, v in os.environ.items() if k != "OMNIVOICE_API_KEY"}
        cmd = [sys.executable, "-m", "omnivoice", "serve", "--profile", str(profile)]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**environ, **(env or {})},
            start_new_session=own_group,
        )  # fmt: skip
        self.lines: list[str] = []
        self.port: int | None = None
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            found = re.search(r"omnivoice serving \S+ on http://127\.0\.0\.1:(\d+)", line)
            if found:
                self.port = int(found.group(1))
                self._ready.set()
        self._ready.set()

    def wait_ready(self, timeout: float) -> str:
        self._ready.wait(timeout)
        assert self.port is not None, "".join(self.lines[-40:])
        return f"http://127.0.0.1:{self.port}"

    def wait_log_closed(self, timeout: float) -> bool:
        """Until every process that holds the log pipe (the server, its stage processes) has ended;
        False if one still held it after `timeout`."""
        self._reader.join(timeout)
        return not self._reader.is_alive()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    @property
    def log(self) -> str:
        return "".join(self.lines)
