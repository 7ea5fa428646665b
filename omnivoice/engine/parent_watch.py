"""Whether the server that started this stage process is still running, whichever way it was started.

A spawned stage process is the server's child, but one forked by a forkserver (engine/process_start.py)
is the forkserver's: there `os.getppid()` names the forkserver, which may outlive the server for a
moment or die before it, and says nothing of the server. What does hold for both start methods is
the pipe `multiprocessing` keeps open from the process that asked for the start (the server) to the
child: its end in the child (`parent_process().sentinel`) reads end-of-file once the server's process
has ended, however it ended. Stage processes are told the server's pid and watch that pipe; a process
that `multiprocessing` did not start from that pid (a worker run by hand) falls back to its parent's
pid.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from multiprocessing.connection import wait


def server_sentinel(server: int) -> int | None:
    """The pipe end that reads end-of-file once the process `server` that started this one has ended;
    None where this process was not started by `multiprocessing` from that process."""
    proc = mp.parent_process()
    if proc is None or proc.pid != server or proc.sentinel is None:
        return None
    return proc.sentinel


def server_alive(server: int) -> bool:
    """True while the process `server` that started this one runs (see the module docstring)."""
    sentinel = server_sentinel(server)
    if sentinel is None:
        return os.getppid() == server
    return not wait([sentinel], timeout=0)
