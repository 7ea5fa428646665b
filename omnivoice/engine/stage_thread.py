"""A stage worker on a thread of the server process: it builds its runner in that thread, then serves.

Building in the thread that serves matters on a GPU: the CUDA graphs a runner captures keep the
cuBLAS workspace of the thread and stream they were captured on, and each thread has cuBLAS handles of
its own, so graphs of different stages replaying side by side never share a workspace. The builds
run one after the other: torch.compile's tracing is not thread-safe, and a stage's eager warm-up
beside another stage's graph capture is refused by CUDA. A build that fails is reported to the engine
as StageCrashed, and the builds waiting for their turn then give up.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from omnivoice.config import PriorityConfig
from omnivoice.engine.board import Seat
from omnivoice.engine.stage import StageCrashed, StageWorker
from omnivoice.types import StageName

log = logging.getLogger(__name__)


class BuildTurns:
    """The order in which n stage threads build: thread i after thread i - 1."""

    def __init__(self, n: int) -> None:
        self.failed = False
        self._done = [threading.Event() for _ in range(n)]

    @contextmanager
    def turn(self, index: int) -> Iterator[bool]:
        """Wait for thread `index`'s turn; yields False when an earlier build failed (do not build)."""
        if index > 0:
            self._done[index - 1].wait()
        try:
            yield not self.failed
        except BaseException:
            self.failed = True
            raise
        finally:
            self._done[index].set()


def stage_thread_main(
    factory: Any,
    turns: BuildTurns,
    index: int,
    name: StageName,
    replica: int,
    inbox: Any,
    downstream: list[Any],
    engine: Any,
    seat: Seat | None,
    priority: PriorityConfig,
) -> None:
    """Thread target: build stage `name`'s runner (`factory`: a RunnerFactory) in its turn, then serve."""
    try:
        with turns.turn(index) as go:
            if not go:
                log.info("%s stage (replica %d): not built (an earlier stage failed)", name, replica)
                return
            runner = factory.build(name, replica, report=engine.put)
    except Exception as e:  # report, so the engine fails fast instead of waiting
        log.exception("%s stage (replica %d) failed to start", name, replica)
        engine.put(StageCrashed(name, repr(e)))
        return
    StageWorker(runner, inbox, downstream, engine, replica=replica, seat=seat, priority=priority).run()
