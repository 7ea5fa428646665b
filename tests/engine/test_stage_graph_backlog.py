"""A stage worker captures the graphs its runner left for after the start only while the runner has
no work, reports how many are left, and keeps a step that had to capture one out of its step times."""

from __future__ import annotations

import threading
from typing import Any

import torch

from omnivoice.engine.connectors import LocalConnector
from omnivoice.engine.stage import StageWorker
from omnivoice.messages import Shutdown
from omnivoice.runners.graph_backlog import GraphBacklog
from omnivoice.runners.priority import Priority
from omnivoice.types import StageStats
from tests.engine.test_stage_tables import latest_stats
from tests.support.cpu_graphs import CpuGraphs
from tests.support.polling import wait_until

WIDTHS = (16, 24, 32, 48)  # left for later, narrowest first
NARROW, WIDE = 2, 24


def _step(x: torch.Tensor) -> tuple[torch.Tensor]:
    return (x + 1,)


class BackloggedRunner:
    """Steps a batch of NARROW rows while `busy`; its `wide` step needs a graph left for later."""

    name = "talker"

    def __init__(self) -> None:
        self.graphs = CpuGraphs(_step, "talker decode")
        self.graph_backlog = GraphBacklog("talker")
        for rows in WIDTHS:
            self.graph_backlog.add(self.graphs, rows, self._capturer(rows))
        self.busy = threading.Event()
        self.busy.set()
        self.wide = threading.Event()
        self.steps = 0
        self._batch = 0

    def _capturer(self, rows: int):
        return lambda: self.graphs(rows, {"x": torch.zeros(rows)})

    def accept(self, msg: Any) -> list[Any]:
        return []

    def abort(self, request_id: str) -> None: ...

    def has_work(self) -> bool:
        return self.busy.is_set()

    def urgency(self) -> Priority | None:
        return Priority.NORMAL if self.has_work() else None

    def step(self, defer_ahead: bool = False) -> list[Any]:
        rows = NARROW
        if self.wide.is_set():
            self.wide.clear()
            rows = WIDE
            self.graphs(rows, {"x": torch.ones(rows)})  # narrow steps replay no graph of the backlog's
        self._batch = rows
        self.steps += 1
        return []

    def active_ids(self) -> list[str]:
        return []

    def stats(self) -> StageStats:
        return StageStats(self.name, 0, 0, self._batch, self.steps)


def test_graphs_left_for_later_are_captured_while_idle_and_counted_down() -> None:
    runner = BackloggedRunner()
    inbox, engine = LocalConnector(), LocalConnector()
    worker = StageWorker(runner, inbox, [], engine)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: runner.steps >= 20, 5, what="20 busy steps")
        assert runner.graphs.order == []  # nothing captured while the runner has work
        runner.wide.set()  # the next step needs the 24-row graph: it captures it first
        wait_until(lambda: runner.graphs.order == [WIDE], 5, what="the wide step's capture")
        s = latest_stats(engine, lambda s: s.graphs_pending == len(WIDTHS) - 1)
        assert WIDE not in {size for size, _, _ in s.step_times}  # that step's time includes a capture
        assert NARROW in {size for size, _, _ in s.step_times}
        runner.busy.clear()  # idle: the rest is captured, narrowest first
        latest_stats(engine, lambda s: s.graphs_pending == 0)
        assert runner.graphs.order == [WIDE, 16, 32, 48]
        assert (runner.graph_backlog.deferred, runner.graph_backlog.idle) == (4, 3)
    finally:
        inbox.put(Shutdown())
        thread.join(5)
