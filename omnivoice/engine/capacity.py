"""Measured capacity: how many audio streams the stages can serve in real time.

Each stage worker keeps the time its steps took at each batch size (`StepTimes`, a moving average
per size) and reports it with its stats. `stage_streams` fits

    step time = base + per_request x batch

to what one worker measured (least squares over the sizes it has seen; from one size alone, a line
through the origin, the cautious reading until larger batches have been seen) and finds the largest
batch whose step still fits the stage's budget: the audio one step makes for each request (a frame
of text for the thinker, a frame for the talker, a chunk for Code2Wav) times the headroom. The
engine's capacity is the smallest over its stages (`engine_capacity`); the server refuses a stream
that would go past it, and any new stream while an admitted one has already run dry.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from omnivoice.config import CapacityConfig
from omnivoice.types import StageStats

EMA = 0.05  # weight of a new step in its size's moving average (once the size has 1 / EMA steps)
MAX_WEIGHT = 200  # steps of one size counted in a fit at most: a common size must not drown the rest


class StepTimes:
    """A worker's step times by batch size: a moving average and a count per size seen."""

    def __init__(self) -> None:
        self._mean: dict[int, float] = {}
        self._count: dict[int, int] = {}

    def add(self, batch: int, seconds: float) -> None:
        """Count one step that ran `batch` requests (a step that ran none is not counted)."""
        if batch < 1:
            return
        n = self._count.get(batch, 0) + 1
        self._count[batch] = n
        old = self._mean.get(batch, seconds)
        self._mean[batch] = old + (seconds - old) * max(EMA, 1.0 / n)

    def snapshot(self) -> tuple[tuple[int, float, int], ...]:
        """(batch size, mean step seconds, steps) per size seen, by size."""
        return tuple((b, self._mean[b], self._count[b]) for b in sorted(self._mean))


def fit(times: Sequence[tuple[int, float, int]]) -> tuple[float, float] | None:
    """(base, per-request) seconds of a step from (batch, mean seconds, steps) per size; None if empty."""
    if not times:
        return None
    if len(times) == 1:
        b, t, _ = times[0]
        return 0.0, t / b
    w = [min(n, MAX_WEIGHT) for _, _, n in times]
    total = sum(w)
    mb = sum(wi * b for wi, (b, _, _) in zip(w, times, strict=True)) / total
    mt = sum(wi * t for wi, (_, t, _) in zip(w, times, strict=True)) / total
    var = sum(wi * (b - mb) ** 2 for wi, (b, _, _) in zip(w, times, strict=True))
    cov = sum(wi * (b - mb) * (t - mt) for wi, (b, t, _) in zip(w, times, strict=True))
    per = max(cov / var, 0.0)
    return max(mt - per * mb, 0.0), per


def stage_streams(
    times: Sequence[tuple[int, float, int]], budget_s: float, cfg: CapacityConfig, cap: int
) -> int | None:
    """Requests one worker can step within `budget_s` x headroom each (at most `cap`); None until it
    has measured `cfg.min_steps` steps."""
    if sum(n for _, _, n in times) < cfg.min_steps:
        return None
    line = fit(times)
    assert line is not None
    base, per = line
    room = budget_s * cfg.headroom - base
    if room < 0:
        return 0
    if per <= 0:
        return cap
    return min(cap, math.floor(room / per + 1e-9))  # 1e-9: a budget met exactly is met


def engine_capacity(
    workers: Sequence[StageStats], budgets: dict[str, float], caps: dict[str, int], cfg: CapacityConfig
) -> tuple[int | None, dict[str, int | None]]:
    """Streams the engine can serve in real time (None: not measured yet), and each stage's figure.

    A stage's figure is the sum over its workers; a worker not measured yet counts as its best
    measured sibling (requests are spread evenly over replicas)."""
    per_stage: dict[str, int | None] = {}
    for name, budget in budgets.items():
        mine = [stage_streams(w.step_times, budget, cfg, caps[name]) for w in workers if w.name == name]
        known = [n for n in mine if n is not None]
        per_stage[name] = sum(known) + (len(mine) - len(known)) * max(known) if known else None
    known_stages = [n for n in per_stage.values() if n is not None]
    return (min(known_stages) if known_stages else None), per_stage
