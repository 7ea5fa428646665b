"""A/B comparison arithmetic: the alternation order, and ratios of means with their spread.

Pure functions over run records, so the figures `omnivoice bench ab` prints can be checked on fixed
records. A ratio is always B over A: above 1 means revision B takes longer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from statistics import fmean

from omnivoice.bench.metrics import central_interval

SIDES = ("A", "B")


@dataclass(frozen=True)
class RunRecord:
    """One workload run against one revision's server: its place in the alternation and its figures."""

    side: str  # "A" or "B"
    round: int  # 0-based; each round has one run of each side
    position: int  # 0-based place in the whole alternation
    metrics: dict[str, float | None] = field(default_factory=dict)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class Comparison:
    """One metric of A against B: the means, the ratio of means and how far it spreads."""

    metric: str
    mean_a: float
    mean_b: float
    ratio: float  # mean_b / mean_a
    ci_low: float  # bootstrap interval of the ratio of means
    ci_high: float
    paired_min: float | None  # min / max over the rounds of B's run over A's run in the same round
    paired_max: float | None
    runs_a: int
    runs_b: int


def schedule(rounds: int) -> list[tuple[int, str]]:
    """(round, side) in serving order, A B B A A B ...: each side goes first in every other round, so
    a steady drift of the machine's speed weighs on both sides alike."""
    order: list[tuple[int, str]] = []
    for r in range(rounds):
        first, second = SIDES if r % 2 == 0 else SIDES[::-1]
        order += [(r, first), (r, second)]
    return order


def _values(records: list[RunRecord], side: str, metric: str) -> list[float]:
    out = []
    for rec in records:
        value = rec.metrics.get(metric) if rec.ok and rec.side == side else None
        if value is not None:
            out.append(float(value))
    return out


def paired_ratios(records: list[RunRecord], metric: str) -> list[float]:
    """B over A within each round where both runs gave the metric, in round order."""
    by_round: dict[int, dict[str, float]] = {}
    for rec in records:
        value = rec.metrics.get(metric) if rec.ok else None
        if value is not None:
            by_round.setdefault(rec.round, {})[rec.side] = float(value)
    return [
        pair["B"] / pair["A"]
        for _, pair in sorted(by_round.items())
        if "A" in pair and "B" in pair and pair["A"] > 0
    ]


def bootstrap_ratio(
    a: list[float], b: list[float], samples: int = 2000, level: float = 0.9, seed: int = 0
) -> tuple[float, float]:
    """A central `level` interval of mean(B)/mean(A), resampling each side's runs with replacement
    (a fixed seed, so the same runs give the same interval)."""
    rng = random.Random(seed)
    ratios = []
    for _ in range(samples):
        ma = fmean(rng.choices(a, k=len(a)))
        mb = fmean(rng.choices(b, k=len(b)))
        if ma > 0:
            ratios.append(mb / ma)
    ratios.sort()
    if not ratios:
        return float("nan"), float("nan")
    return central_interval(ratios, level)


def compare(records: list[RunRecord], metric: str, samples: int = 2000) -> Comparison | None:
    """The comparison of one metric, or None when either side has no run that gave it."""
    a, b = _values(records, "A", metric), _values(records, "B", metric)
    if not a or not b or fmean(a) <= 0:
        return None
    low, high = bootstrap_ratio(a, b, samples=samples)
    paired = paired_ratios(records, metric)
    return Comparison(
        metric=metric,
        mean_a=fmean(a),
        mean_b=fmean(b),
        ratio=fmean(b) / fmean(a),
        ci_low=low,
        ci_high=high,
        paired_min=min(paired) if paired else None,
        paired_max=max(paired) if paired else None,
        runs_a=len(a),
        runs_b=len(b),
    )
