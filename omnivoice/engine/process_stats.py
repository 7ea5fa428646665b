"""What a process holds, read off /proc (Linux; elsewhere the figures are 0): resident memory, open file
descriptors, its start time, and the shared-memory segments the server's connectors named.

Stage workers report their own figures with their StageStats (a process may live on another node);
the server reads its own for /v1/debug/state and /metrics.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

SHM_DIR = Path("/dev/shm")
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True)
class ProcessStats:
    pid: int
    rss_bytes: int
    open_fds: int
    threads: int


def process_stats(pid: int | None = None) -> ProcessStats:
    """This process's (or `pid`'s) resident set, open fds and threads; zeros where /proc is missing."""
    pid = os.getpid() if pid is None else pid
    proc = Path(f"/proc/{pid}")
    try:
        rss = int((proc / "statm").read_text().split()[1]) * _PAGE
        fds = len(os.listdir(proc / "fd"))
        threads = len(os.listdir(proc / "task"))
    except (OSError, ValueError, IndexError):
        return ProcessStats(pid, 0, 0, 0)
    return ProcessStats(pid, rss, fds, threads)


def start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot), None if no such process is running (or it is a
    zombie). A pid is recycled once its process ends; the pid with its start time names one process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else int(fields[19])  # fields 3 and 22 of proc(5)


def shm_prefix(server_pid: int | None = None) -> str:
    """Name prefix of the shared-memory segments the connectors of the server `server_pid` create, so
    the server can count its own segments in /dev/shm among everyone else's."""
    return f"omnivoice{os.getpid() if server_pid is None else server_pid}_"


def shm_segments(prefix: str | None = None) -> int:
    """Segments in /dev/shm whose name starts with `prefix` (default: this server's)."""
    prefix = shm_prefix() if prefix is None else prefix
    try:
        return sum(1 for name in os.listdir(SHM_DIR) if name.startswith(prefix))
    except OSError:
        return 0


def unlink_segments(prefix: str) -> list[str]:
    """Unlink every segment in /dev/shm whose name starts with `prefix`; the names unlinked."""
    try:
        names = [name for name in os.listdir(SHM_DIR) if name.startswith(prefix)]
    except OSError:
        return []
    gone = []
    for name in names:
        try:
            (SHM_DIR / name).unlink()
        except OSError:  # unlinked meanwhile by its reader, or not ours to unlink
            continue
        gone.append(name)
    return gone
