"""A stage worker and the priority board: it publishes how urgent its work is; while a worker on its
device holds FIRST or DRY work its AHEAD requests wait (`defer_ahead`), and if all its work is AHEAD
it gives way, for at most `max_yield_ms` in a row; with nothing urgent anywhere it never waits."""

from __future__ import annotations

import threading
import time
from typing import Any

from omnivoice.config import PriorityConfig
from omnivoice.engine.board import PriorityBoard, seats
from omnivoice.engine.connectors import LocalConnector
from omnivoice.engine.stage import StageWorker
from omnivoice.messages import Shutdown
from omnivoice.runners.priority import Priority
from omnivoice.types import StageStats
from tests.support.polling import wait_until


class ClassRunner:
    """A talker whose work, `steps` steps of it, is all of one class; records each step's defer_ahead."""

    name = "talker"

    def __init__(self, urgency: Priority, steps: int) -> None:
        self.class_ = urgency
        self.steps = steps
        self.deferred: list[bool] = []

    def accept(self, msg: Any) -> list[Any]:
        return []

    def abort(self, request_id: str) -> None:
        pass

    def has_work(self) -> bool:
        return len(self.deferred) < self.steps

    def urgency(self) -> Priority | None:
        return self.class_ if self.has_work() else None

    def step(self, defer_ahead: bool = False) -> list[Any]:
        self.deferred.append(defer_ahead)
        time.sleep(0.001)
        return []

    def active_ids(self) -> list[str]:
        return []

    def stats(self) -> StageStats:
        return StageStats(self.name, 0, 0, 1, len(self.deferred))


class Running:
    """The runner's worker in a thread, with a peer seat on its board (the thinker, on its device)."""

    def __init__(self, runner: ClassRunner, max_yield_ms: float, peer: Priority) -> None:
        board = PriorityBoard.local(2)
        seat = seats(board, [("talker", "cpu"), ("thinker", "cpu")])
        self.me, self.peer = seat["talker"], seat["thinker"]
        self.peer.publish(peer)  # before the worker's first step
        self.inbox = LocalConnector()
        cfg = PriorityConfig(yield_ms=1.0, max_yield_ms=max_yield_ms)
        self.worker = StageWorker(runner, self.inbox, [], LocalConnector(), seat=self.me, priority=cfg)
        self.thread = threading.Thread(target=self.worker.run, daemon=True)

    def __enter__(self) -> Running:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.inbox.put(Shutdown())
        self.thread.join(5)
        assert self.me.board.read(self.me.index) is None  # a worker that stopped holds no one up


def test_all_ahead_work_gives_way_to_urgent_work_until_it_is_done() -> None:
    runner = ClassRunner(Priority.AHEAD, steps=5)
    with Running(runner, max_yield_ms=60_000, peer=Priority.FIRST) as run:
        wait_until(lambda: run.worker._gave_way_s > 0, 5, what="the worker giving way")
        time.sleep(0.2)
        assert runner.deferred == []  # not one step while the thinker's FIRST work waits
        assert run.me.board.read(run.me.index) == Priority.AHEAD
        run.peer.publish(Priority.NORMAL)
        wait_until(lambda: not runner.has_work(), 5, what="the AHEAD steps")
    assert runner.deferred == [False] * 5


def test_giving_way_is_bounded() -> None:
    runner = ClassRunner(Priority.AHEAD, steps=3)
    # urgent for good: the AHEAD work still runs, between waits
    with Running(runner, max_yield_ms=5, peer=Priority.DRY) as run:
        wait_until(lambda: not runner.has_work(), 5, what="the AHEAD steps")
        assert run.worker._gave_way_s >= 3 * 0.005


def test_normal_work_steps_without_its_ahead_requests_while_a_peer_is_urgent() -> None:
    runner = ClassRunner(Priority.NORMAL, steps=3)
    with Running(runner, max_yield_ms=60_000, peer=Priority.FIRST) as run:
        wait_until(lambda: not runner.has_work(), 5, what="the steps")
    assert runner.deferred == [True] * 3 and run.worker._gave_way_s == 0


def test_with_nothing_urgent_anywhere_nothing_waits() -> None:
    runner = ClassRunner(Priority.AHEAD, steps=50)
    with Running(runner, max_yield_ms=60_000, peer=Priority.AHEAD) as run:
        wait_until(lambda: not runner.has_work(), 5, what="the steps")
    assert runner.deferred == [False] * 50 and run.worker._gave_way_s == 0
