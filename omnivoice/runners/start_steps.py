"""The steps of a stage worker's start (loading, compiling, capturing graphs), timed and reported.

A start takes minutes on a GPU; a supervisor or a person watching it must be able to tell a slow
start from a stuck one. Each step a runner takes while it is built is reported twice through the
worker's report callable (the engine's inbox, in a thread or a process alike): when it begins and
when it ends, with its seconds. The engine gathers them (engine/start_progress.py) into the log and
`/health`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from omnivoice.messages import StartStep

log = logging.getLogger(__name__)


Report = Callable[[StartStep], None]


class StartSteps:
    """Times the start steps of one stage replica and reports each through `report` (None: only logs
    them)."""

    def __init__(self, stage: str, replica: int = 0, report: Report | None = None) -> None:
        self.stage = stage
        self.replica = replica
        self._report = report

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Report `name` begun, run the block, report it done with its seconds (also when it raises:
        the step ended, and the failure is reported by the worker)."""
        self._send(StartStep(self.stage, self.replica, name))
        began = time.perf_counter()
        try:
            yield
        finally:
            took = time.perf_counter() - began
            log.debug("%s#%d start: %s took %.1f s", self.stage, self.replica, name, took)
            self._send(StartStep(self.stage, self.replica, name, took))

    def _send(self, msg: StartStep) -> None:
        if self._report is None:
            return
        try:
            self._report(msg)
        except Exception:  # progress is for watching; a start never fails for want of it
            log.warning("could not report start step %s", msg.name, exc_info=True)
