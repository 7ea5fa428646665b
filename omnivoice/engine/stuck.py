"""Stage workers that stop making progress: a GPU kernel that never ends, a wait that is never met.

A live stage worker reports its figures (StageStats) every loop, at least once a second when idle and
after every step when busy; a worker blocked in one step for minutes reports nothing and raises
nothing, and its requests would wait forever. The engine watches the reports: a worker silent for
`stages.stuck_after_s` is stuck. Its requests fail with the reason; a stage process is killed (and
restarted like any dead worker); a stage thread cannot be stopped, so the server exits for its
supervisor, as after a device fault. The log gets every thread's stack first: where it was stuck.
"""

from __future__ import annotations

import sys
import threading
import traceback
from collections.abc import Iterable


class ProgressWatch:
    """When each stage worker last reported, and which have been silent too long."""

    def __init__(self, after_s: float) -> None:
        self.after_s = after_s  # 0: never judged stuck
        self._last: dict[tuple[str, int], float] = {}

    def reset(self, workers: Iterable[tuple[str, int]], now: float) -> None:
        """Watch `workers` from `now` (a pipeline started or restarted)."""
        self._last = dict.fromkeys(workers, now)

    def seen(self, stage: str, replica: int, now: float) -> None:
        if (stage, replica) in self._last:
            self._last[(stage, replica)] = now

    def stuck(self, now: float) -> list[tuple[str, int, float]]:
        """(stage, replica, seconds silent) of each worker silent for `after_s` or longer."""
        if self.after_s <= 0:
            return []
        return [(s, r, now - t) for (s, r), t in self._last.items() if now - t >= self.after_s]


def thread_stacks() -> str:
    """Every thread's current Python stack, named, as text for the log."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame))
        parts.append(f"thread {names.get(ident, '?')} ({ident}):\n{stack}")
    return "\n".join(parts)
