"""`omnivoice bench realtime` against a real server over the fake engine: spoken turns end by server VAD."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest

from omnivoice.bench.realtime_cli import add_arguments, auto_client_processes, format_table, run
from tests.support.fake_engine import Script, serve_realtime


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")
def test_two_sessions_report_voice_to_voice_latency(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out = tmp_path / "rt.json"
    with serve_realtime(Script(audio_chunks=4, delay=0.005, cached_tokens=3)) as srv:
        args = parser.parse_args(
            ["--base-url", srv.url, "--sessions", "2", "--turns", "1", "--warmups", "0", "--speech-text",
             "Hello there.", "--silence-ms", "300", "--quiet", "--output-json", str(out)]
        )  # fmt: skip
        assert run(args) == 0
    report = json.loads(out.read_text())
    s = report["summary"]
    assert s["turns"] == 2 and s["errors"] == 0
    v2v = s["voice_to_voice_ms"]
    assert 0 < v2v["p50"] <= v2v["p95"] < 3000
    assert s["turn_detection_ms"]["p50"] > 0 and s["audio_seconds"] == pytest.approx(0.8, abs=0.01)
    assert "voice-to-voice" in capsys.readouterr().out and "voice-to-voice" in format_table(report)
    # the same load with the speculative responses on, then off, each with the server's counts
    on, off = report["runs"]["on"], report["runs"]["off"]
    assert on["summary"] == s and off["summary"]["turns"] == 2
    assert on["speculation"]["confirmed"] == 2
    # each answered turn, in the order its speech ended, names the response that answered it
    ids = [t["response_id"] for t in on["turns"]]
    assert len(on["turns"]) == 2 and len(set(ids)) == 2 and all(i.startswith("resp_") for i in ids)
    assert on["turns"][0]["at_s"] == 0.0 <= on["turns"][1]["at_s"]
    # ...and its prompt's tokens, of which the server reported 3 cached (response.done's usage)
    assert all(t["cached_tokens"] == 3 < t["input_tokens"] for t in on["turns"])
    assert on["speculation"]["started"] == 2 + on["speculation"]["dropped"]
    assert off["speculation"] == dict.fromkeys(off["speculation"], 0)
    assert "speculative responses: off" in format_table(report)
    # the client's own event loop was sampled throughout each run
    lag = on["client_loop_lag_ms"]
    assert lag["samples"] >= 1 and 0 <= lag["p50"] <= lag["p99"] <= lag["max"]
    assert "client event loop lag ms" in format_table(report)


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")
def test_sessions_dealt_over_client_processes_are_each_measured_once(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out = tmp_path / "rt.json"
    with serve_realtime(Script(audio_chunks=2, delay=0.005)) as srv:
        args = parser.parse_args(
            ["--base-url", srv.url, "--sessions", "3", "--turns", "1", "--warmups", "0", "--speech-text",
             "Hello there.", "--silence-ms", "300", "--speculative", "on", "--client-processes", "2",
             "--quiet", "--output-json", str(out)]
        )  # fmt: skip
        assert run(args) == 0
    report = json.loads(out.read_text())
    assert report["client_processes"] == 2
    s = report["summary"]
    assert s["turns"] == 3 and s["errors"] == 0
    assert s["audio_seconds"] == pytest.approx(3 * 0.2, abs=0.01)
    assert report["runs"]["on"]["speculation"]["confirmed"] == 3
    # every client process sampled its event loop, and sent its samples back with its records
    assert report["runs"]["on"]["client_loop_lag_ms"]["samples"] >= 2


def test_client_processes_grow_with_sessions_within_half_the_cores() -> None:
    assert auto_client_processes(1, cores=16) == 1
    assert auto_client_processes(32, cores=16) == 1
    assert auto_client_processes(33, cores=16) == 2
    assert auto_client_processes(100, cores=16) == 4
    assert auto_client_processes(1000, cores=16) == 8
    assert auto_client_processes(100, cores=2) == 1


def test_bad_client_processes_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert run(parser.parse_args(["--client-processes", "-1", "--speech-text", "Hi."])) == 2
    assert "--client-processes" in capsys.readouterr().err


def test_turns_without_figures_say_why_in_the_summary() -> None:
    from omnivoice.bench.realtime_cli import summarize
    from omnivoice.bench.realtime_load import TurnRecord

    answered = TurnRecord(0, 0, speech_end=1.0, stopped=1.3, first_audio=1.4, status="completed")
    answered.chunks.append((1.4, 1.0))
    records = [
        answered,
        TurnRecord(1, 0, speech_end=1.0, stopped=1.3, status="cancelled"),  # ended without audio
        TurnRecord(2, 0, speech_end=1.0, stopped=1.3, status="cancelled"),
        TurnRecord(3, 0, error="timeout"),
        TurnRecord(4, 0, speech_end=1.0),  # no response ever ended
    ]
    s = summarize(records, 10.0)
    assert s["turns"] == 1 and s["errors"] == 4
    assert s["failures"] == {
        "no audio: the response ended cancelled": 2,
        "timeout": 1,
        "no audio: no response ended": 1,
    }
    assert next(iter(s["failures"])) == "no audio: the response ended cancelled"  # the commonest first


def test_each_answered_turn_is_placed_in_time_and_the_p95_gets_its_interval() -> None:
    from omnivoice.bench.realtime_cli import format_table, per_turn, summarize
    from omnivoice.bench.realtime_load import TurnRecord

    records = []
    for i in range(12):  # speech ends 0.5 s apart, listed last-first; the last turn is the slow one
        end = 100.0 + 0.5 * (11 - i)
        slow = 0.4 if i == 0 else 0.0
        r = TurnRecord(i, 0, speech_end=end, stopped=end + 0.27, first_audio=end + 0.28 + slow)
        r.chunks.append((r.first_audio, 1.0))  # type: ignore[arg-type]
        records.append(r)
    records.append(TurnRecord(12, 0, error="timeout"))
    turns = per_turn(records)
    assert [t["session"] for t in turns] == list(range(11, -1, -1))  # in the order their speech ended
    assert turns[0]["at_s"] == 0.0 and turns[-1]["at_s"] == 5.5
    assert turns[-1]["voice_to_voice_ms"] == 680.0 and turns[0]["voice_to_voice_ms"] == 280.0
    assert turns[0]["turn_detection_ms"] == 270.0 and turns[0]["response_ms"] == 10.0
    s = summarize(records, 10.0)
    lo, hi = s["voice_to_voice_ms"]["p95_interval"]
    assert 280.0 - 1e-6 <= lo <= s["voice_to_voice_ms"]["p95"] <= hi <= 680.0 + 1e-6
    report = {"sessions": 13, "turns_per_session": 1, "machine": "m", "summary": s}
    assert f"(p95 90 % interval {lo:.0f}-{hi:.0f})" in format_table(report)
    assert summarize(records[:3], 10.0)["voice_to_voice_ms"]["p95_interval"] is None
