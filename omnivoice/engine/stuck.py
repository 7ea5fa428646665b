"""Stage workers that stop making progress: a GPU kernel that never ends, a wait that is never met.

A live stage worker reports its figures (StageStats) every loop, at least once a second when idle and
after every step when busy; a worker blocked in one step for minutes reports nothing and raises
nothing, and its requests would wait forever. The engine watches the reports: a worker silent for
`stages.stuck_after_s` is stuck. Its requests fail with the reason; a stage process is killed (and
restarted like any dead worker); a stage thread cannot be stopped, so the server exits for its
supervisor, as after a device fault. The log gets every thread's stack first: where it was stuck.

A worker can also go on reporting while nothing moves: it steps, but no step makes any request
progress (work it holds can never run, a wait between stages never met). So the engine also watches
its requests: while any is in flight, some request must get output (a token, audio, its end) at
least once every `stuck_after_s`. If none does, the engine is stalled: the log gets every stage's
figures and every thread's stack (stage processes print theirs to stderr on SIGUSR1), and the stages
restart as for a stuck worker.
"""

from __future__ import annotations

import sys
import threading
import traceback
from collections.abc import Iterable

from omnivoice.types import StageStats


class ProgressWatch:
    """When each stage worker last reported, and which have been silent too long."""

    def __init__(self, after_s: float) -> None:
        self.after_s = after_s  # 0: never judged stuck
        self._last: dict[tuple[str, int], float] = {}
        self._progress = 0.0  # when a request last got output, or none was in flight

    def reset(self, workers: Iterable[tuple[str, int]], now: float) -> None:
        """Watch `workers` from `now` (a pipeline started or restarted)."""
        self._last = dict.fromkeys(workers, now)
        self._progress = now

    def progress(self, now: float) -> None:
        """A request got output at `now`, or none was in flight: the engine is not stalled then."""
        self._progress = max(self._progress, now)

    def seen(self, stage: str, replica: int, now: float) -> None:
        if (stage, replica) in self._last:
            self._last[(stage, replica)] = now

    def stuck(self, now: float) -> list[tuple[str, int, float]]:
        """(stage, replica, seconds silent) of each worker silent for `after_s` or longer."""
        if self.after_s <= 0:
            return []
        return [(s, r, now - t) for (s, r), t in self._last.items() if now - t >= self.after_s]

    def stalled(self, now: float) -> float | None:
        """Seconds since a request in flight last got output, once that is `after_s` or more; else None
        (callers report `progress` while no request is in flight)."""
        silent = now - self._progress
        return silent if self.after_s > 0 and silent >= self.after_s else None


def thread_stacks() -> str:
    """Every thread's current Python stack, named, as text for the log."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame))
        parts.append(f"thread {names.get(ident, '?')} ({ident}):\n{stack}")
    return "\n".join(parts)


def stage_lines(stats: Iterable[StageStats]) -> str:
    """One line per stage worker: what it holds and how far it has stepped (for a stall's log)."""
    return "\n".join(
        f"{s.name} replica {s.replica}: {s.running} running, {s.queued} queued, {s.steps} steps, "
        f"last batch {s.last_batch_size}, {s.kv_slots_used} KV slots used, {s.routes} routes, gave way "
        f"{s.gave_way_s:.1f} s"
        for s in stats
    )
