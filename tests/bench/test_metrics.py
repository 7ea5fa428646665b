import pytest

from omnivoice.bench.metrics import (
    RequestRecord,
    percentile,
    percentile_interval,
    playback_stall,
    rtf,
    summarize,
)


def test_percentile_interpolates_like_numpy() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == pytest.approx(2.5)
    assert percentile(values, 99) == pytest.approx(3.97)
    assert percentile(values, 100) == 4.0
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)


def test_p95_interval_brackets_the_p95_and_widens_with_a_heavy_tail() -> None:
    steady = [266.0 + (i % 5) for i in range(64)]
    tail = [266.0] * 58 + [300.0, 340.0, 380.0, 420.0, 460.0, 500.0]
    lo, hi = percentile_interval(steady, 95)  # type: ignore[misc]
    assert 266.0 <= lo <= percentile(steady, 95) <= hi <= 270.0
    t_lo, t_hi = percentile_interval(tail, 95)  # type: ignore[misc]
    assert t_lo <= percentile(tail, 95) <= t_hi
    assert t_hi - t_lo > 10 * (hi - lo)  # the 4th-worst of 64 turns moves with which turns were slow
    assert percentile_interval(tail, 95) == (t_lo, t_hi)  # a fixed seed: the same turns, the same interval
    assert percentile_interval([5.0] * 10, 95) == (5.0, 5.0)


def test_no_interval_for_fewer_than_ten_values() -> None:
    assert percentile_interval([1.0] * 9, 95) is None
    assert percentile_interval([], 95) is None


def test_no_stall_when_audio_arrives_ahead_of_playback() -> None:
    # 0.32 s chunk at 1.0, then 2 s chunks well before the buffer runs dry
    assert playback_stall([(1.0, 0.32), (1.2, 2.0), (2.0, 2.0)]) == 0.0
    assert playback_stall([]) == 0.0
    assert playback_stall([(5.0, 1.0)]) == 0.0


def test_stall_after_a_small_first_chunk() -> None:
    # vLLM-Omni's CPU pattern: a 0.32 s first chunk, the next one 1.62 s later -> 1.3 s of silence
    assert playback_stall([(0.5, 0.32), (2.12, 2.0), (3.0, 2.0)]) == pytest.approx(1.3)


def test_stall_is_cumulative_lag_over_chunks() -> None:
    # buffer runs dry at 1.5 (wait 0.5 until 2.0), again at 2.5 (by then 1.0 behind schedule in total)
    chunks = [(1.0, 0.5), (2.0, 0.5), (3.0, 0.5)]
    assert playback_stall(chunks) == pytest.approx(1.0)


def test_rtf_uses_last_audio_arrival_from_send_time() -> None:
    r = RequestRecord(t0=10.0, audio_chunks=[(10.2, 0.32), (11.0, 2.0), (12.0, 2.0)])
    assert r.first_audio == 10.2
    assert r.last_audio == 12.0
    assert r.audio_seconds == pytest.approx(4.32)
    assert rtf(r) == pytest.approx(2.0 / 4.32)
    assert rtf(RequestRecord(t0=0.0)) is None


def _record(t0: float, ttft: float, chunks: list[tuple[float, float]], tokens: int) -> RequestRecord:
    return RequestRecord(
        t0=t0,
        first_text=t0 + ttft,
        audio_chunks=[(t0 + dt, s) for dt, s in chunks],
        text_tokens=tokens,
        end=t0 + chunks[-1][0] + 0.01,
    )


def test_summarize_figures() -> None:
    records = [
        _record(0.0, 0.1, [(0.2, 0.32), (0.5, 2.0)], 10),  # rtf 0.5/2.32, no stall
        _record(1.0, 0.3, [(0.4, 0.32), (2.0, 1.0)], 20),  # stall 2.0 - 0.72 = 1.28, rtf 2.0/1.32
        RequestRecord(t0=2.0, error="HTTP 500: boom", text_tokens=99, audio_chunks=[(2.5, 9.0)]),
    ]
    s = summarize(records, duration_s=4.0)
    assert s.requests == 2
    assert s.errors == 1
    assert s.ttft_ms.mean == pytest.approx(200.0)
    assert s.ttft_ms.p50 == pytest.approx(200.0)
    assert s.ttft_ms.p99 == pytest.approx(298.0)
    assert s.ttfp_ms.mean == pytest.approx(300.0)
    assert s.rtf.mean == pytest.approx((0.5 / 2.32 + 2.0 / 1.32) / 2)
    assert s.rtf.p99 == pytest.approx(0.5 / 2.32 + 0.99 * (2.0 / 1.32 - 0.5 / 2.32))
    # failed requests count in errors only, never in throughput
    assert s.audio_seconds == pytest.approx(3.64)
    assert s.audio_s_per_s == pytest.approx(3.64 / 4.0)
    assert s.text_tokens == 30
    assert s.output_tok_per_s == pytest.approx(7.5)
    assert s.max_stall_ms == pytest.approx(1280.0)
    assert s.mean_stall_ms == pytest.approx(640.0)
    assert s.latency_ms.mean == pytest.approx((510.0 + 2010.0) / 2)
    assert s.no_audio == 0


def test_summarize_text_only_and_empty_runs() -> None:
    text_only = RequestRecord(t0=0.0, first_text=0.05, text_tokens=8, end=0.5)
    s = summarize([text_only], duration_s=0.5)
    assert s.requests == 1
    assert s.ttft_ms.mean == pytest.approx(50.0)
    assert s.ttfp_ms.mean is None and s.rtf.p99 is None
    assert s.max_stall_ms is None
    assert s.no_audio == 1
    assert s.output_tok_per_s == pytest.approx(16.0)

    empty = summarize([RequestRecord(t0=0.0, error="refused")], duration_s=0.0)
    assert empty.requests == 0 and empty.errors == 1
    assert empty.audio_s_per_s == 0.0 and empty.ttft_ms.mean is None
