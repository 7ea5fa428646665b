"""The run's figures from two scrapes of /metrics (bench/server_metrics.py): histogram quantiles as
Prometheus reads them, and each stage's time over the run, its counters read from their reset where
its process was started again in between."""

from __future__ import annotations

import pytest

from omnivoice.bench.server_metrics import Samples, breakdown, format_lines, quantile

INF = float("inf")


def test_quantile_interpolates_within_the_bucket() -> None:
    buckets = [(0.01, 50.0), (0.1, 90.0), (1.0, 100.0), (INF, 100.0)]
    assert quantile(0.5, buckets) == pytest.approx(0.01)
    assert quantile(0.7, buckets) == pytest.approx(0.01 + 0.09 * 0.5)
    assert quantile(0.25, buckets) == pytest.approx(0.005)
    assert quantile(0.5, [(0.01, 0.0), (INF, 0.0)]) is None
    assert quantile(0.99, [(0.01, 1.0), (INF, 10.0)]) == 0.01  # in the top bucket: its lower bound


def scrape(lag_counts: list[float], busy: float, cpu: float, steps: float) -> Samples:
    bounds = ("0.01", "0.1", "+Inf")
    stage = (("stage", "talker"),)
    return {
        "omnivoice_event_loop_lag_seconds_bucket": {
            (("le", b),): c for b, c in zip(bounds, lag_counts, strict=True)
        },
        "omnivoice_event_loop_lag_seconds_count": {(): lag_counts[-1]},
        "omnivoice_event_loop_lag_seconds_sum": {(): 0.002 * lag_counts[-1]},
        "omnivoice_stage_steps_total": {stage: steps},
        "omnivoice_stage_busy_seconds_total": {stage: busy},
        "omnivoice_stage_step_cpu_seconds_total": {stage: cpu},
        "omnivoice_stage_step_blocked_seconds_total": {stage: busy - cpu},
        "omnivoice_engine_capacity_streams": {(): 16.0},
    }


def test_breakdown_is_the_difference_over_the_run() -> None:
    before = scrape([100, 100, 100], busy=1.0, cpu=0.5, steps=10)
    after = scrape([100, 190, 200], busy=3.0, cpu=1.5, steps=110)
    b = breakdown(before, after, seconds=10.0)
    assert b is not None
    assert b["event_loop_lag"]["samples"] == 100
    assert b["event_loop_lag"]["p50_ms"] == pytest.approx(10 + 90 * 50 / 90)  # within the 2nd bucket
    talker = b["stages"]["talker"]
    assert talker["steps"] == 100 and talker["busy_share"] == pytest.approx(0.2)
    assert talker["step_ms"] == pytest.approx(20) and talker["host_ms_per_step"] == pytest.approx(10)
    assert talker["blocked_share_of_step"] == pytest.approx(0.5)
    assert talker["gpu_utilization_percent"] is None  # no GPU counter: no figure
    before["omnivoice_stage_gpu_busy_seconds_total"] = {(("stage", "talker"),): 5.0}
    after["omnivoice_stage_gpu_busy_seconds_total"] = {(("stage", "talker"),): 8.0}
    with_gpu = breakdown(before, after, seconds=10.0)
    assert with_gpu is not None
    assert with_gpu["stages"]["talker"]["gpu_utilization_percent"] == pytest.approx(30)
    assert b["capacity_streams"] == {"before": 16.0, "after": 16.0}
    assert breakdown(None, after, 10.0) is None


def test_a_stage_restarted_during_the_run_counts_from_its_restart() -> None:
    before = scrape([100, 100, 100], busy=50.0, cpu=30.0, steps=4000)
    after = scrape([100, 190, 200], busy=2.0, cpu=1.0, steps=100)  # its counters began again
    b = breakdown(before, after, seconds=10.0)
    assert b is not None
    talker = b["stages"]["talker"]
    assert talker["steps"] == 100 and talker["busy_share"] == pytest.approx(0.2)
    assert talker["host_ms_per_step"] == pytest.approx(10) and talker[
        "blocked_share_of_step"
    ] == pytest.approx(0.5)


def test_front_door_and_server_cpu_over_the_run() -> None:
    def door(ticks: float, appends: float, busy: float, wait: float, cpu: float) -> Samples:
        s = scrape([1, 1, 1], busy=1.0, cpu=0.5, steps=1)
        s["omnivoice_front_door_ticks_total"] = {(): ticks}
        s["omnivoice_front_door_appends_total"] = {(): appends}
        s["omnivoice_front_door_busy_seconds_total"] = {(): busy}
        s["omnivoice_front_door_wait_seconds_total"] = {(): wait}
        s["process_cpu_seconds_total"] = {(): cpu}
        return s

    b = breakdown(door(10, 100, 1.0, 0.5, 20.0), door(60, 1100, 6.0, 2.5, 35.0), seconds=10.0)
    assert b is not None
    assert b["front_door"] == {
        "appends": 1000,
        "mean_batch": 20,
        "busy_share": pytest.approx(0.5),
        "wait_ms_per_append": pytest.approx(2.0),
    }
    assert b["server_process_cores"] == pytest.approx(1.5)
    assert b["intake_lag"]["samples"] == 0 and b["intake_lag"]["p50_ms"] is None  # none exported
    # a server without a front door (or an older one) reports none
    plain = breakdown(scrape([1, 1, 1], 1, 0.5, 1), scrape([1, 1, 2], 2, 1, 2), seconds=10.0)
    assert plain is not None and plain["front_door"]["appends"] is None
    assert plain["server_process_cores"] is None


def test_each_core_hop_is_its_own_histogram_over_the_run() -> None:
    def hops(request: tuple[float, float], channel: tuple[float, float]) -> Samples:
        s = scrape([1, 1, 1], busy=1.0, cpu=0.5, steps=1)
        name = "omnivoice_core_hop_seconds"
        s[f"{name}_bucket"] = {}
        for hop, (fast, total) in (("request", request), ("channel", channel)):
            s[f"{name}_bucket"][(("hop", hop), ("le", "0.001"))] = fast
            s[f"{name}_bucket"][(("hop", hop), ("le", "+Inf"))] = total
            s.setdefault(f"{name}_count", {})[(("hop", hop),)] = total
            s.setdefault(f"{name}_sum", {})[(("hop", hop),)] = 0.0005 * total
        return s

    b = breakdown(hops((10, 10), (5, 5)), hops((30, 30), (5, 45)), seconds=10.0)
    assert b is not None
    request, channel = b["core_hops"]["request"], b["core_hops"]["channel"]
    assert request["samples"] == 20 and request["p95_ms"] == pytest.approx(0.95)  # all under 1 ms
    assert channel["samples"] == 40 and channel["p50_ms"] == pytest.approx(1.0)  # all 40 slower
    assert b["chat"]["prepare"]["samples"] == 0  # no chat request in the run


def test_realtime_responses_as_the_server_sent_them_over_the_run() -> None:
    def sent(first_audio: tuple[float, float], underrun: tuple[float, float]) -> Samples:
        s = scrape([1, 1, 1], busy=1.0, cpu=0.5, steps=1)
        name = "omnivoice_realtime_response_seconds"
        fast, total = first_audio
        s[f"{name}_bucket"] = {
            (("le", "0.1"), ("phase", "first_audio")): fast,
            (("le", "+Inf"), ("phase", "first_audio")): total,
        }
        s[f"{name}_count"] = {(("phase", "first_audio"),): total}
        s[f"{name}_sum"] = {(("phase", "first_audio"),): 0.05 * total}
        name = "omnivoice_realtime_playback_underrun_seconds"
        none, total = underrun
        s[f"{name}_bucket"] = {(("le", "0.01"),): none, (("le", "+Inf"),): total}
        s[f"{name}_count"] = {(): total}
        s[f"{name}_sum"] = {(): 0.5 * (total - none)}
        return s

    b = breakdown(sent((4, 4), (2, 4)), sent((14, 14), (7, 14)), seconds=10.0)
    assert b is not None
    rt = b["realtime"]
    assert rt["first_audio"]["samples"] == 10 and rt["first_audio"]["mean_ms"] == pytest.approx(50)
    assert rt["first_text"]["samples"] == 0  # none exported
    assert rt["underrun"]["samples"] == 10 and rt["underrun"]["p50_ms"] == pytest.approx(10)
    assert rt["underrun"]["mean_ms"] == pytest.approx(250)  # 5 of 10 waited 0.5 s


def test_the_thinkers_prompt_positions_and_audio_windows_over_the_run() -> None:
    def prompt(cached: float, computed: float, encoded: float, ahead: float) -> Samples:
        s = scrape([1, 1, 1], busy=1.0, cpu=0.5, steps=1)
        s["omnivoice_stage_prompt_positions_total"] = {
            (("source", "cached"), ("stage", "thinker")): cached,
            (("source", "computed"), ("stage", "thinker")): computed,
        }
        s["omnivoice_stage_audio_windows_total"] = {
            (("source", "ahead"), ("stage", "thinker")): ahead,
            (("source", "encoded"), ("stage", "thinker")): encoded,
        }
        return s

    b = breakdown(prompt(100, 400, 10, 2), prompt(1600, 900, 30, 14), seconds=10.0)
    assert b is not None
    assert b["thinker_prompt"] == {"cached": 1500, "computed": 500}
    assert b["thinker_audio_windows"] == {"encoded": 20, "ahead": 12}
    assert any("1500 cached, 500 computed (75 % cached)" in line for line in format_lines(b))
    # a server that does not export them (an older one): no figures, no line
    plain = breakdown(scrape([1, 1, 1], 1, 0.5, 1), scrape([1, 1, 2], 2, 1, 2), seconds=10.0)
    assert plain is not None and plain["thinker_prompt"] == {}
    assert not any("prompt positions" in line for line in format_lines(plain))
