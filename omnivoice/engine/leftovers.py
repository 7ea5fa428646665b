"""What a server that died without stopping its stages (kill -9, the OOM killer) leaves behind, and
taking it back at the next start.

Stage processes end with their server (omnivoice/engine/stage_process.py), but one that cannot run
(stopped, stuck in a driver call) outlives it, and the shared-memory segments of the messages in
flight (named by `process_stats.shm_prefix`) stay in /dev/shm until someone unlinks them. So every
pipeline with stage processes writes a run record: its server's pid and its workers' pids, each with
the process's start time, since a pid is recycled once its process ends and a recycled one must never
be taken for ours. A clean stop removes the record; `reclaim`, at the next engine start, finds the
records of servers that are gone, kills their workers that still run and unlinks their segments.

Records live in $OMNIVOICE_RUN_DIR, else $XDG_RUNTIME_DIR/omnivoice, else ~/.cache/omnivoice/run.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
from dataclasses import asdict, dataclass
from pathlib import Path

from omnivoice.engine.process_stats import shm_prefix, start_time, unlink_segments

log = logging.getLogger(__name__)

RUN_DIR_ENV = "OMNIVOICE_RUN_DIR"


def run_dir() -> Path:
    """Where run records are kept (see the module docstring)."""
    if given := os.environ.get(RUN_DIR_ENV):
        return Path(given)
    if runtime := os.environ.get("XDG_RUNTIME_DIR"):
        return Path(runtime) / "omnivoice"
    return Path.home() / ".cache" / "omnivoice" / "run"


@dataclass(frozen=True)
class ProcessId:
    """One process: its pid and its start time (the pid alone may name a later process)."""

    pid: int
    start: int
    name: str = ""

    @classmethod
    def of(cls, pid: int, name: str = "") -> ProcessId | None:
        start = start_time(pid)
        return None if start is None else cls(pid, start, name)

    def running(self) -> bool:
        return start_time(self.pid) == self.start


class RunRecord:
    """The record of one pipeline's stage processes, removed when the pipeline stops."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def write(cls, workers: list[tuple[str, int]]) -> RunRecord | None:
        """Record this server and `workers` (name, pid); None (logged) if the record cannot be written."""
        server = ProcessId.of(os.getpid(), "server")
        procs = [p for name, pid in workers if (p := ProcessId.of(pid, name)) is not None]
        if server is None:  # no /proc: nothing to record a process by
            return None
        directory = run_dir()
        path = directory / f"{server.pid}-{secrets.token_hex(4)}.json"
        body = {"server": asdict(server), "workers": [asdict(p) for p in procs]}
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            partial = path.with_suffix(".tmp")
            partial.write_text(json.dumps(body))
            partial.replace(path)  # whole or absent: a reader never sees half a record
        except OSError as e:
            log.warning("cannot write the run record %s (%s): after a crash, nothing reclaims", path, e)
            return None
        return cls(path)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


@dataclass(frozen=True)
class Reclaimed:
    """What `reclaim` took back from one server that had died."""

    server_pid: int
    killed: tuple[ProcessId, ...]
    segments: int


def reclaim() -> list[Reclaimed]:
    """Kill the stage processes that servers now gone left running, unlink those servers' segments
    and drop their records; logs what was taken back. Records of running servers are left alone."""
    directory = run_dir()
    try:
        paths = sorted(directory.glob("*.json"))
    except OSError:
        return []
    done: list[Reclaimed] = []
    for path in paths:
        try:
            body = json.loads(path.read_text())
            server = ProcessId(**body["server"])
            workers = [ProcessId(**w) for w in body["workers"]]
        except FileNotFoundError:  # its server stopped (or another start reclaimed it) meanwhile
            continue
        except (OSError, ValueError, TypeError, KeyError) as e:
            log.warning("dropping the unreadable run record %s (%s)", path, e)
            path.unlink(missing_ok=True)
            continue
        if server.running():
            continue
        done.append(_take_back(server, workers))
        path.unlink(missing_ok=True)
    return done


def _take_back(server: ProcessId, workers: list[ProcessId]) -> Reclaimed:
    killed = []
    for w in workers:
        if w.running():
            try:
                os.kill(w.pid, signal.SIGKILL)
            except OSError:  # it ended meanwhile
                continue
            killed.append(w)
    # The segments carry the dead server's pid. Were that pid now another running process's (a
    # recycled pid) it could be a server of ours whose segments are live: leave them then.
    holder = start_time(server.pid)
    recycled = holder is not None and server.pid != os.getpid()
    segments = [] if recycled else unlink_segments(shm_prefix(server.pid))
    if killed or segments:
        log.warning(
            "reclaimed what the omnivoice server with pid %d left when it died: killed %d stage "
            "process(es) still running%s; unlinked %d shared-memory segment(s) (%s*)",
            server.pid,
            len(killed),
            "".join(f"{', ' if i else ': '}{w.name} (pid {w.pid})" for i, w in enumerate(killed)),
            len(segments),
            shm_prefix(server.pid),
        )
    else:
        log.info("the omnivoice server with pid %d died; its stage processes had ended with it", server.pid)
    return Reclaimed(server.pid, tuple(killed), len(segments))
