"""What other processes write to their stderr from now on, read through `/proc/<pid>/fd/2`.

Stage processes forked from a forkserver inherit the forkserver's stderr, not the test's: under pytest
that is whichever capture file was fd 2 when the forkserver started (an earlier test's, or the
session's), so `capfd` never sees them. Reading each process's own fd 2 finds their output wherever it
goes, as long as it is a regular file (pytest's fd capture); otherwise the test is skipped.
"""

from __future__ import annotations

import os
import stat

import pytest


class StderrTail:
    """The text each distinct stderr file of `pids` gained since this was made."""

    def __init__(self, pids: list[int]) -> None:
        self._starts: dict[tuple[int, int], tuple[str, int]] = {}
        for pid in pids:
            path = f"/proc/{pid}/fd/2"
            try:
                info = os.stat(path)
            except FileNotFoundError:
                pytest.skip("no /proc/<pid>/fd on this system")
            if not stat.S_ISREG(info.st_mode):
                pytest.skip("a stage process's stderr is not a file (run without -s)")
            self._starts.setdefault((info.st_dev, info.st_ino), (path, info.st_size))

    def text(self) -> str:
        """Everything written to those files since; a file truncated meanwhile is read from its start."""
        parts = []
        for path, start in self._starts.values():
            with open(path, "rb") as f:
                if os.fstat(f.fileno()).st_size >= start:
                    f.seek(start)
                parts.append(f.read().decode(errors="replace"))
        return "".join(parts)
