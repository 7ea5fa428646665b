"""A stage worker reports its per-request tables with its stats, and they drain: a request's route to
the next stage goes when it finishes, fails or is aborted, and tombstones of aborted ids expire."""

from __future__ import annotations

import os
import re
import threading
import time
from typing import Any

import pytest

from omnivoice.engine import stage
from omnivoice.engine.connectors import LocalConnector
from omnivoice.engine.stage import StageWorker
from omnivoice.messages import Abort, NewRequest, Shutdown, StageFinished, ThinkerChunk
from omnivoice.runners.priority import Priority
from omnivoice.types import GenerationRequest, Prompt, StageStats
from tests.support.polling import wait_until


class HoldingRunner:
    """A thinker that holds every request until told to finish or fail it."""

    name = "thinker"

    def __init__(self) -> None:
        self.held: dict[str, GenerationRequest] = {}
        self.finish: set[str] = set()
        self.fail: set[str] = set()

    def accept(self, msg: Any) -> list[Any]:
        self.held[msg.request.request_id] = msg.request
        return [ThinkerChunk(msg.request.request_id, (), None, False, request=msg.request)]

    def abort(self, request_id: str) -> None:
        self.held.pop(request_id, None)

    def has_work(self) -> bool:
        return bool(self.finish & self.held.keys() or self.fail & self.held.keys())

    def urgency(self) -> Priority | None:
        return Priority.NORMAL if self.has_work() else None

    def step(self, defer_ahead: bool = False) -> list[Any]:
        if self.fail & self.held.keys():
            raise RuntimeError("boom")
        done = sorted(self.finish & self.held.keys())
        for rid in done:
            del self.held[rid]
        return [StageFinished(rid, "thinker", "stop", 1) for rid in done]

    def active_ids(self) -> list[str]:
        return list(self.held)

    def stats(self) -> StageStats:
        return StageStats(self.name, 0, len(self.held), 0, 0)


def latest_stats(engine: LocalConnector, until: Any, timeout: float = 5.0) -> StageStats:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        msg = engine.get(timeout=0.1)
        if isinstance(msg, StageStats):
            last = msg
            if until(msg):
                return msg
    raise AssertionError(f"stats never matched; last: {last}")


def request(rid: str) -> NewRequest:
    return NewRequest(GenerationRequest(rid, Prompt((1, 2, 3)), route=(0, 0, 0)))


def test_tables_drain_and_tombstones_expire(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stage, "TOMBSTONE_TTL_S", 0.5)
    monkeypatch.setattr(stage, "IDLE_STATS_INTERVAL_S", 0.1)
    runner = HoldingRunner()
    inbox, talker, engine = LocalConnector(), LocalConnector(), LocalConnector()
    worker = StageWorker(runner, inbox, [talker], engine)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        for rid in ("a", "b", "c"):
            inbox.put(request(rid))
        s = latest_stats(engine, lambda s: s.running == 3)
        assert (s.routes, s.tombstones, s.pid) == (3, 0, os.getpid()) and s.rss_bytes > 0 and s.open_fds > 0
        runner.finish.add("a")  # finished: its route goes with its StageFinished
        s = latest_stats(engine, lambda s: s.running == 2)
        assert (s.routes, s.tombstones) == (2, 0)
        inbox.put(Abort("c"))  # aborted: its route goes, a tombstone comes
        s = latest_stats(engine, lambda s: s.running == 1)
        assert (s.routes, s.tombstones) == (1, 1)
        runner.fail.add("b")  # failed in a step: its route goes, a tombstone comes
        inbox.put(Abort("x"))  # never seen here: a tombstone all the same
        s = latest_stats(engine, lambda s: s.running == 0 and s.tombstones == 3)
        assert s.routes == 0
        inbox.put(request("c"))  # a late message for an aborted request does not start it again
        s = latest_stats(engine, lambda s: s.tombstones == 0)  # expired
        assert (s.running, s.routes, s.live_requests) == (0, 0, 0)
    finally:
        inbox.put(Shutdown())
        thread.join(5)


class SteppingRunner(HoldingRunner):
    """Steps while `steps` lasts; the one numbered `slow` takes 0.2 s, the others 2 ms."""

    def __init__(self, steps: int, slow: int) -> None:
        super().__init__()
        self.steps, self.slow, self.done = steps, slow, 0

    def has_work(self) -> bool:
        return self.done < self.steps

    def step(self, defer_ahead: bool = False) -> list[Any]:
        time.sleep(0.2 if self.done == self.slow else 0.002)
        self.done += 1
        return []


def test_a_step_far_slower_than_usual_is_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(stage, "SLOW_S", 0.1)
    runner = SteppingRunner(steps=30, slow=20)
    inbox, engine = LocalConnector(), LocalConnector()
    worker = StageWorker(runner, inbox, [], engine)
    thread = threading.Thread(target=worker.run, daemon=True)
    with caplog.at_level("INFO", logger="omnivoice.engine.stage"):
        thread.start()
        try:
            wait_until(lambda: runner.done >= runner.steps, 5, what="every step of the runner")
        finally:
            inbox.put(Shutdown())
            thread.join(5)
    slow = [r.getMessage() for r in caplog.records if "slow" in r.getMessage()]
    assert len(slow) == 1, slow  # the one slow step; not the 2 ms ones, nor the first (no usual yet)
    assert slow[0].startswith("thinker stage: slow: a step took 2") and "0 running, 0 queued" in slow[0]
    # the runner slept: blocked, not on a CPU (where the schedstat file exists, as on Linux)
    blocked = re.search(r"on a CPU (\d+) ms, waiting for one (\d+) ms, blocked (\d+) ms", slow[0])
    assert blocked is not None, slow[0]
    assert int(blocked[3]) >= 150 and int(blocked[1]) < 100, slow[0]


class PrefillingRunner(SteppingRunner):
    """Every third step also prefills (and takes 50 ms); the others decode a batch of 4 in 2 ms."""

    def step(self, defer_ahead: bool = False) -> list[Any]:
        self.done += 1
        time.sleep(0.05 if self.done % 3 == 0 else 0.002)
        return []

    def stats(self) -> StageStats:
        return StageStats(self.name, 0, 4, 4, self.done, last_step_prefilled=self.done % 3 == 0)


def test_steps_that_prefilled_are_not_timed_as_decode_steps() -> None:
    runner = PrefillingRunner(steps=30, slow=-1)
    inbox, engine = LocalConnector(), LocalConnector()
    thread = threading.Thread(target=StageWorker(runner, inbox, [], engine).run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: runner.done >= runner.steps, 5, what="every step of the runner")
        s = latest_stats(engine, lambda s: sum(n for _, _, n in s.step_times) == 20)
    finally:
        inbox.put(Shutdown())
        thread.join(5)
    ((batch, median, steps),) = s.step_times
    assert (batch, steps) == (4, 20) and median < 0.04  # the 10 prefilling steps are left out
