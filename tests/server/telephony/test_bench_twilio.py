"""`omnivoice bench realtime --transport twilio` against a real server over the fake engine: calls speak,
the server's VAD ends the turns, latency is measured to the first outgoing `media` frame."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest

from omnivoice.bench.realtime_cli import add_arguments, format_table, run
from tests.support.fake_engine import Script, serve_realtime


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")
def test_two_calls_report_voice_to_first_media_latency(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out = tmp_path / "twilio.json"
    with serve_realtime(Script(audio_chunks=4, delay=0.005)) as srv:
        args = parser.parse_args(
            ["--base-url", srv.url, "--transport", "twilio", "--sessions", "2", "--turns", "1",
             "--warmups", "0", "--speech-text", "Hello there.", "--silence-ms", "300", "--quiet",
             "--speculative", "on", "--output-json", str(out)]
        )  # fmt: skip
        assert run(args) == 0
        engine = srv.engine
    report = json.loads(out.read_text())
    assert report["transport"] == "twilio" and report["url"].endswith("/v1/telephony/twilio")
    s = report["summary"]
    assert s["turns"] == 2 and s["errors"] == 0 and s["statuses"] == {"played": 2}
    v2v = s["voice_to_voice_ms"]
    assert 0 < v2v["p50"] <= v2v["p95"]
    assert s["turn_detection_ms"]["p50"] is None  # Twilio has no speech_stopped
    assert s["audio_seconds"] == pytest.approx(0.8, abs=0.05)  # 4 x 0.1 s per call, in 20 ms frames
    assert s["max_stall_ms"] >= 0  # measured (its size is the benchmark's to report)
    assert [r.cache_key is not None for r in engine.requests] == [True, True]
    assert report["runs"]["on"]["speculation"]["confirmed"] == 2  # the call's parameter asked for it
    lag = report["runs"]["on"]["server"]["event_loop_lag"]  # from /metrics before and after the run
    assert lag["samples"] > 0 and 0 <= lag["p50_ms"] <= lag["p99_ms"]
    assert "realtime (twilio)" in capsys.readouterr().out and "voice-to-voice" in format_table(report)
