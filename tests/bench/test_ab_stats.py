"""The A/B arithmetic on fixed run records: alternation order, ratio of means, paired ratios, interval."""

from __future__ import annotations

import math

import pytest

from omnivoice.bench.ab_stats import RunRecord, bootstrap_ratio, compare, paired_ratios, schedule


def _records(a: list[float], b: list[float], metric: str = "latency_ms") -> list[RunRecord]:
    """Records in serving order for per-round values of A and B."""
    out = []
    for pos, (rnd, side) in enumerate(schedule(len(a))):
        value = (a if side == "A" else b)[rnd]
        out.append(RunRecord(side, rnd, pos, {metric: value}))
    return out


def test_the_schedule_alternates_which_side_goes_first() -> None:
    assert schedule(1) == [(0, "A"), (0, "B")]
    assert schedule(3) == [(0, "A"), (0, "B"), (1, "B"), (1, "A"), (2, "A"), (2, "B")]
    order = schedule(4)
    assert [side for _, side in order].count("A") == 4 and len(order) == 8


def test_ratio_of_means_and_paired_ratios_on_fixed_runs() -> None:
    records = _records([100.0, 200.0, 300.0], [110.0, 260.0, 300.0])
    c = compare(records, "latency_ms")
    assert c is not None
    assert c.mean_a == pytest.approx(200.0) and c.mean_b == pytest.approx(670.0 / 3)
    assert c.ratio == pytest.approx(670.0 / 600.0)  # the ratio of the means, not the mean of ratios
    assert paired_ratios(records, "latency_ms") == pytest.approx([1.1, 1.3, 1.0])
    assert c.paired_min == pytest.approx(1.0) and c.paired_max == pytest.approx(1.3)
    assert c.runs_a == c.runs_b == 3


def test_the_bootstrap_interval_holds_the_ratio_and_is_repeatable() -> None:
    a, b = [100.0, 120.0, 90.0, 110.0], [120.0, 125.0, 118.0, 130.0]
    low, high = bootstrap_ratio(a, b)
    ratio = (sum(b) / 4) / (sum(a) / 4)
    assert low <= ratio <= high
    assert min(b) / max(a) <= low and high <= max(b) / min(a)  # resampled means stay within the runs
    assert bootstrap_ratio(a, b) == (low, high)


def test_identical_runs_give_a_ratio_of_one_with_no_spread() -> None:
    c = compare(_records([50.0, 50.0], [50.0, 50.0]), "latency_ms")
    assert c is not None
    assert (c.ratio, c.ci_low, c.ci_high, c.paired_min, c.paired_max) == (1.0, 1.0, 1.0, 1.0, 1.0)


def test_failed_runs_and_missing_figures_are_left_out() -> None:
    records = [
        RunRecord("A", 0, 0, {"latency_ms": 100.0, "ttfp_ms": None}),
        RunRecord("B", 0, 1, {"latency_ms": 999.0}, error="0 succeeded, 8 failed"),
        RunRecord("B", 1, 2, {"latency_ms": 150.0, "ttfp_ms": 20.0}),
        RunRecord("A", 1, 3, {"latency_ms": 100.0, "ttfp_ms": 10.0}),
    ]
    c = compare(records, "latency_ms")
    assert c is not None and c.ratio == pytest.approx(1.5) and (c.runs_a, c.runs_b) == (2, 1)
    assert paired_ratios(records, "latency_ms") == [1.5]  # round 0 has no B that counts
    ttfp = compare(records, "ttfp_ms")
    assert ttfp is not None and ttfp.ratio == pytest.approx(2.0) and ttfp.runs_a == 1
    assert compare(records, "voice_to_voice_ms") is None


def test_a_side_without_any_run_gives_no_comparison() -> None:
    records = [RunRecord("A", 0, 0, {"latency_ms": 100.0}), RunRecord("B", 0, 1, error="server died")]
    assert compare(records, "latency_ms") is None
    assert paired_ratios(records, "latency_ms") == []
    assert all(math.isfinite(x) for x in bootstrap_ratio([1.0], [2.0]))
