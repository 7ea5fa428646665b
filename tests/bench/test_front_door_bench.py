"""`omnivoice bench front-door`: a few sessions of espeak-ng speech through the front door, batched and
per session, hear the turns the per-session path hears alone, and the report says so."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from omnivoice.cli import main


@pytest.mark.slow
@pytest.mark.parametrize("mode", [["--workers", "2"], ["--per-session"]])
def test_sessions_hear_their_turns_and_the_report_is_written(tmp_path: Path, capsys, mode: list[str]) -> None:
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    out = tmp_path / "front-door.json"
    argv = ["bench", "front-door", "--sessions", "1,3", "--seconds", "7", "--speech-text", "Hello there."]
    assert main([*argv, "--gap-s", "1", "--ramp-s", "0.2", *mode, "--output-json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [r["sessions"] for r in report["runs"]] == [1, 3]
    for r in report["runs"]:
        assert r["workers"] == (0 if mode == ["--per-session"] else 2)
        assert r["audio_s_per_session"] == pytest.approx(7.0)
        assert r["expected_started"] >= 3 * r["sessions"]  # a short phrase every 2 s or so
        assert (r["turns_started"], r["turns_ended"]) == (r["expected_started"], r["expected_ended"])
        assert r["cpu_s_per_audio_s_per_session"] > 0 and r["lag_ms"]["max"] >= r["lag_ms"]["p50"]
    assert "CPU s / audio s / session" in capsys.readouterr().out


def test_bad_options_exit_2(capsys) -> None:
    assert main(["bench", "front-door", "--sessions", "0"]) == 2
    assert "--sessions" in capsys.readouterr().err
