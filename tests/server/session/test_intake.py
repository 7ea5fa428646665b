"""A session's audio intake clock (session/intake.py): the backlog is the audio not yet handled of
what a live caller has sent by now; a client ahead of real time moves the origin, never a backlog."""

from __future__ import annotations

import pytest

from omnivoice.server.session.intake import LAG_BUCKETS, IntakeClock, IntakeStats

RATE = 16000


def test_a_session_that_keeps_up_has_no_backlog_and_one_that_falls_behind_has() -> None:
    stats = IntakeStats()
    clock = IntakeClock(stats, RATE)
    assert clock.handled(320, now=100.02) == 0.0  # the first 20 ms, handled as it ended
    assert clock.handled(640, now=100.04) == pytest.approx(0.0)  # in step with the caller
    # the next 20 ms handled 0.5 s late: the caller has said 0.5 s more than the session heard
    assert clock.handled(960, now=100.56) == pytest.approx(0.5)
    assert clock.handled(1280, now=100.58) == pytest.approx(0.5)  # still that far behind
    assert stats.appends == 4 and stats.lag_sum_s == pytest.approx(1.0)
    assert stats.buckets == sorted(stats.buckets) and stats.buckets[-1] == 4  # cumulative
    assert stats.buckets[LAG_BUCKETS.index(0.25)] == 2 and stats.buckets[LAG_BUCKETS.index(0.5)] == 4


def test_audio_sent_faster_than_real_time_moves_the_origin() -> None:
    stats = IntakeStats()
    clock = IntakeClock(stats, RATE)
    clock.handled(RATE, now=10.0)
    assert clock.handled(10 * RATE, now=10.1) == 0.0  # 9 s of a file in 0.1 s: ahead, no backlog
    assert clock.handled(10 * RATE + 320, now=10.12) == pytest.approx(0.0)
    # two sessions share the app's stats
    IntakeClock(stats, RATE).handled(320, now=50.0)
    assert stats.appends == 4
