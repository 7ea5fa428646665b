"""How far an engine start has come, and how much of it the last start says remains.

The stage workers report each step of their start (runners/start_steps.py) through the engine's
inbox; the engine reports its own (loading the model, the warm-up burst). `StartProgress` gathers
them: the log says when each step begins and ends, and `/health` shows the steps, each with its
seconds and the seconds the same step took the last time, and what remains of the expected time.
The expectations come from the times of the last complete start with the same model, stage settings
and torch version (engine/start_record.py); a first start has none, and reports its steps without a
share. A step running far past its expected time is what a stuck start looks
like; one a little past it is a slow start.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from omnivoice.messages import StartStep

log = logging.getLogger(__name__)


class StartProgress:
    """The steps of one engine start: done, running, and expected (thread-safe)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, log_steps: bool = True) -> None:
        self._clock = clock
        self._log_steps = log_steps  # False where another process's StartProgress logs the same steps
        self._lock = threading.Lock()
        self._began = clock()
        self._expected: dict[str, float] = {}
        self._expected_total = 0.0  # the last start's seconds, its steps' and everything between them
        self._done: dict[str, float] = {}  # step name -> seconds, in the order they ended
        self._running: dict[str, float] = {}  # step name -> when it began (clock)

    def quiet(self) -> None:
        """Log no step from now on: another process (the server's supervisor) logs them."""
        self._log_steps = False

    def expect(self, times: dict[str, float], total_s: float) -> None:
        """The seconds each step of the last start took, and the whole start: what this one expects."""
        with self._lock:
            self._expected = dict(times)
            self._expected_total = max(total_s, _critical_path(times))
        if not self._log_steps:
            return
        if times:
            log.info("start: expected to take %.0f s (the last start's time)", self._expected_total)
        else:
            log.info("start: no earlier start of these settings to expect times from")

    def record(self, msg: StartStep) -> None:
        """A worker's step began (`seconds` None) or ended."""
        name = msg.name
        with self._lock:
            expected = self._expected.get(name)
            if msg.seconds is None:
                self._running[name] = self._clock()
            else:
                self._running.pop(name, None)
                self._done[name] = msg.seconds
            remaining, share = self._remaining()
        if not self._log_steps:
            return
        guess = f" (expected {expected:.1f} s)" if expected is not None else ""
        if msg.seconds is None:
            log.info("start: %s ...%s", name, guess)
            return
        left = (
            f"; {share:.0%} of the expected start done, ~{remaining:.0f} s remain"
            if share is not None
            else ""
        )
        log.info("start: %s done in %.1f s%s%s", name, msg.seconds, guess, left)

    def times(self) -> dict[str, float]:
        """The seconds of every step that ended."""
        with self._lock:
            return dict(self._done)

    def elapsed(self) -> float:
        return self._clock() - self._began

    def snapshot(self) -> dict[str, Any]:
        """The start so far, for `/health`: its steps (done and running, each with the seconds it
        took or has taken so far and its expected seconds), the elapsed and expected seconds, what
        remains, and the share done (None without a last start to go by)."""
        now = self._clock()
        with self._lock:
            steps: list[dict[str, Any]] = [
                {"step": n, "state": "done", "seconds": round(s, 1), "expected_s": self._round(n)}
                for n, s in self._done.items()
            ]
            steps += [
                {"step": n, "state": "running", "seconds": round(now - t, 1), "expected_s": self._round(n)}
                for n, t in self._running.items()
            ]
            remaining, share = self._remaining()
            expected = self._expected_total or None
        return {
            "elapsed_s": round(now - self._began, 1),
            "expected_s": round(expected, 1) if expected is not None else None,
            "remaining_s": round(remaining, 1) if share is not None else None,
            "share_done": round(share, 3) if share is not None else None,
            "steps": steps,
        }

    def _round(self, name: str) -> float | None:
        expected = self._expected.get(name)
        return round(expected, 1) if expected is not None else None

    def _remaining(self) -> tuple[float, float | None]:
        """Expected seconds left and the share of the expected time done; the caller holds the lock.

        What is left is the larger of the steps' (steps not begun: all of their expected time; running
        ones: what their expected time has left) and the last start's total less the time so far (the
        time between steps counts too)."""
        total = self._expected_total
        if total <= 0:
            return 0.0, None
        now = self._clock()
        left: dict[str, float] = {}
        for name, expected in self._expected.items():
            if name in self._done:
                continue
            began = self._running.get(name)
            left[name] = max(0.0, expected - (now - began)) if began is not None else expected
        left_s = max(_critical_path(left), total - (now - self._began))
        return left_s, min(1.0, max(0.0, 1.0 - left_s / total))


def _critical_path(times: dict[str, float]) -> float:
    """Seconds of steps named `<worker> <step>`: a worker's steps one after another, the stage workers
    side by side (each stage process builds its own runner), the engine's own steps before and after
    them."""
    lanes: dict[str, float] = {}
    for name, seconds in times.items():
        worker = name.split(" ", 1)[0]
        lanes[worker] = lanes.get(worker, 0.0) + seconds
    engine = sum(v for k, v in lanes.items() if k.startswith("engine"))
    stages = [v for k, v in lanes.items() if not k.startswith("engine")]
    return engine + max(stages, default=0.0)
