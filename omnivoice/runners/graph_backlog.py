"""CUDA graphs captured after a stage is ready: the wide batch buckets, while the stage is idle.

Capturing every (batch bucket, KV bucket) graph before serving makes a start wait for the graphs of
batch widths its first minutes rarely need (past 8 rows, a 128-row stage's buckets are most of its
graphs). With `graphs_at_start`, a runner captures the buckets up to that width before it reports
ready and leaves the rest here, narrowest first. The stage worker captures one of them whenever it has
nothing else to do (`capture_next`), so a while after the start every graph is there. A step that
needs one still left captures it first (StepGraphs.defer: from padding inputs, never the step's own),
which costs that step the capture once; the worker keeps such a step out of its step times.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Hashable

from omnivoice.runners.graphs import StepGraphs

log = logging.getLogger(__name__)


class GraphBacklog:
    """The graphs a runner left for later, in the order they are captured while the stage is idle."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._left: deque[tuple[StepGraphs, Hashable]] = deque()
        self._graphs: list[StepGraphs] = []
        self.deferred = 0  # graphs ever left here
        self.idle = 0  # of them, captured while the stage was idle (the rest: when a step needed one)
        self.idle_s = 0.0

    def add(self, graphs: StepGraphs, key: Hashable, capture: Callable[[], object]) -> None:
        """Leave `graphs`' `key` for later; `capture()` captures it from padding inputs."""
        graphs.defer(key, capture)
        if not graphs.is_deferred(key):
            return  # graphs off, or captured already
        self._left.append((graphs, key))
        self.deferred += 1
        if all(g is not graphs for g in self._graphs):
            self._graphs.append(graphs)

    def __len__(self) -> int:
        """Graphs still left (a step may have captured some of those queued)."""
        while self._left and not self._left[0][0].is_deferred(self._left[0][1]):
            self._left.popleft()
        return sum(g.is_deferred(k) for g, k in self._left)

    def captured(self) -> int:
        """Graphs captured so far by the instances with graphs left here (grows when a step captures one)."""
        return sum(len(g.captured) for g in self._graphs)

    def capture_next(self) -> bool:
        """Capture the next graph still left; False if none is."""
        while self._left:
            graphs, key = self._left.popleft()
            began = time.perf_counter()
            if not graphs.capture_deferred(key):
                continue  # a step needed it first
            self.idle += 1
            self.idle_s += time.perf_counter() - began
            if not self:
                log.info(
                    "%s: the %d CUDA graphs left for after the start are captured (%d while idle, in "
                    "%.1f s; %d when a step first needed them)",
                    self.name,
                    self.deferred,
                    self.idle,
                    self.idle_s,
                    self.deferred - self.idle,
                )
            return True
        return False
