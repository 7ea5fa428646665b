"""Measured capacity: how many audio streams the stages can serve in real time.

Each stage worker keeps the time its steps took at each batch size (`StepTimes`: the median of the
latest steps per size, so the odd step that also prefilled a burst of prompts does not count as the
usual cost) and reports it with its stats. `stage_streams` fits

    step time = base + per_request x batch

to what one worker measured (least squares over the sizes it has seen; from one size alone, a line
through the origin, the cautious reading until larger batches have been seen) and finds the largest
batch whose step still fits the stage's budget: the audio one step makes for each request (a frame
of text for the thinker, a frame for the talker, a chunk for Code2Wav) times the headroom, and at
most twice the widest batch measured (the line is not trusted further: the figure grows as wider
batches are served and measured). Code2Wav's streams each need a window per chunk, not a row in
every step, so its figure is the steps of its widest batch that fit in a chunk's time, times that
batch: it serves more streams than its max_batch. The
engine's capacity is the smallest over its stages (`engine_capacity`); the server refuses a stream
that would go past it, and any new stream while an admitted one has already run dry.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence

from omnivoice.config import CapacityConfig
from omnivoice.types import StageStats

RECENT = 32  # steps of each batch size whose median is its step time
# steps a batch size needs before it counts: a size seen once or twice may have paid a first-time cost
# (a kernel compiled for its shape) that the median of three already leaves out
MIN_SIZE_STEPS = 3
MAX_WEIGHT = 200  # steps of one size counted in a fit at most: a common size must not drown the rest
# the fit is trusted up to this many times the widest batch it has measured: past that a step can cost
# more than the line says (processes contending for a few cores, a GPU out of parallel work)
TRUST_FACTOR = 2


class StepTimes:
    """A worker's step times by batch size: the latest RECENT of each size, and a count per size."""

    def __init__(self) -> None:
        self._recent: dict[int, deque[float]] = {}
        self._count: dict[int, int] = {}

    def add(self, batch: int, seconds: float) -> None:
        """Count one step that ran `batch` requests (a step that ran none is not counted)."""
        if batch < 1:
            return
        self._recent.setdefault(batch, deque(maxlen=RECENT)).append(seconds)
        self._count[batch] = self._count.get(batch, 0) + 1

    def snapshot(self) -> tuple[tuple[int, float, int], ...]:
        """(batch size, median step seconds of its latest steps, steps) per size seen, by size."""
        return tuple((b, statistics.median(self._recent[b]), self._count[b]) for b in sorted(self._recent))


def carry_step_times(
    carried: Sequence[tuple[int, float, int]], fresh: Sequence[tuple[int, float, int]]
) -> tuple[tuple[int, float, int], ...]:
    """A restarted worker's step times: its own for the batch sizes it has timed, its predecessor's
    (`carried`) for the others, by size."""
    by_size = {b: (b, t, n) for b, t, n in carried}
    by_size.update({b: (b, t, n) for b, t, n in fresh})
    return tuple(by_size[b] for b in sorted(by_size))


def fit(times: Sequence[tuple[int, float, int]]) -> tuple[float, float] | None:
    """(base, per-request) seconds of a step from (batch, seconds, steps) per size, the sizes with at
    least MIN_SIZE_STEPS steps; None if there are none."""
    times = [x for x in times if x[2] >= MIN_SIZE_STEPS]
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
    times: Sequence[tuple[int, float, int]],
    budget_s: float,
    cfg: CapacityConfig,
    cap: int,
    rows_per_step: int | None = None,
) -> int | None:
    """Requests one worker can step within `budget_s` x headroom each (at most `cap`); None until it
    has measured `cfg.min_steps` steps.

    `rows_per_step`: for a stage whose requests each need one row per budget, not one in every step
    (Code2Wav: a window per chunk of playback), the most rows one of its steps takes. Such a stage
    serves more requests than a step holds by stepping several times within the budget: as many as
    its steps of that width fit in it, times the width."""
    line = fit(times)
    if line is None or sum(n for _, _, n in times if n >= MIN_SIZE_STEPS) < cfg.min_steps:
        return None
    base, per = line
    room = budget_s * cfg.headroom
    trusted = min(cap, TRUST_FACTOR * max(b for b, _, n in times if n >= MIN_SIZE_STEPS))
    if rows_per_step is not None:
        rows = min(rows_per_step, trusted)
        step = base + per * rows
        if step <= 0:
            return cap
        return min(cap, math.floor(room / step + 1e-9) * rows)
    room -= base
    if room < 0:
        return 0
    if per <= 0:
        return trusted
    return min(trusted, math.floor(room / per + 1e-9))  # 1e-9: a budget met exactly is met


def engine_capacity(
    workers: Sequence[StageStats],
    budgets: dict[str, float],
    caps: dict[str, int],
    cfg: CapacityConfig,
    rows_per_step: dict[str, int] | None = None,
) -> tuple[int | None, dict[str, int | None]]:
    """Streams the engine can serve in real time (None: not measured yet), and each stage's figure.

    A stage's figure is the sum over its workers; a worker not measured yet counts as its best
    measured sibling (requests are spread evenly over replicas). `rows_per_step`: the stages whose
    requests need a row per budget, not per step, with their widest step (`stage_streams`)."""
    widths = rows_per_step or {}
    per_stage: dict[str, int | None] = {}
    for name, budget in budgets.items():
        mine = [
            stage_streams(w.step_times, budget, cfg, caps[name], widths.get(name))
            for w in workers
            if w.name == name
        ]
        known = [n for n in mine if n is not None]
        per_stage[name] = sum(known) + (len(mine) - len(known)) * max(known) if known else None
    known_stages = [n for n in per_stage.values() if n is not None]
    return (min(known_stages) if known_stages else None), per_stage
