"""benchmarks/slow_turns.py (a GPU-run tool) joins a `bench realtime` run's turns with the server's
log lines of their responses' first audio, and says where the slow turns fall."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from omnivoice.server.session.delivery import parts_text
from omnivoice.types import FirstAudio

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "benchmarks" / "slow_turns.py"


def logged(rid: str, first_token_ms: float, frames_ms: float, to_talker_ms: float = 8.0) -> str:
    """The server's line for a response's first audio (server/session/response.py)."""
    parts = parts_text(FirstAudio(first_token_ms, to_talker_ms, frames_ms, 5.0, 5.0, 0.5))
    return (
        f"2026-12-07 03:10:00.000 INFO    omnivoice-front-0 omnivoice.server.session.response: "
        f"session sess_x: response {rid}: the engine's first audio 12 ms after the response began; "
        f"its wait from the request's start: {parts}"
    )


def report_of(turns: list[dict[str, Any]]) -> dict[str, Any]:
    return {"kind": "realtime", "runs": {"on": {"summary": {}, "turns": turns}}}


def turn(session: int, index: int, at_s: float, v2v: float, rid: str | None) -> dict[str, Any]:
    return {
        "session": session, "turn": index, "response_id": rid, "at_s": at_s,
        "voice_to_voice_ms": v2v, "turn_detection_ms": 266.0, "response_ms": v2v - 266.0,
    }  # fmt: skip


def run_tool(
    tmp_path: Path, report: dict[str, Any], log: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "rt.json").write_text(json.dumps(report))
    (tmp_path / "serve.log").write_text(log)
    cmd = [sys.executable, str(TOOL), str(tmp_path / "rt.json"), str(tmp_path / "serve.log"), *extra]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_the_slowest_turns_come_with_their_engine_parts_and_their_place_in_the_run(tmp_path: Path) -> None:
    turns = [turn(s, 0, 0.2 * s, 270.0, f"resp_{s}") for s in range(10)]
    turns += [{**turn(0, 1, 20.0, 750.0, "resp_a"), "input_tokens": 412, "cached_tokens": 0}]
    turns += [{**turn(1, 1, 20.2, 600.0, "resp_b"), "input_tokens": 409, "cached_tokens": 380}]
    turns += [turn(2, 1, 21.0, 400.0, "resp_c"), turn(3, 1, 25.0, 280.0, None)]
    log = "\n".join(
        [logged("resp_a", 420.0, 300.0, -2.4), logged("resp_b", 300.0, 250.0), "an unrelated line"]
        + [logged(f"resp_{s}", 130.0, 90.0) for s in range(10)]
    )
    done = run_tool(tmp_path, report_of(turns), log, "--top", "3", "--json", str(tmp_path / "slow.json"))
    assert done.returncode == 0, done.stderr
    r = json.loads((tmp_path / "slow.json").read_text())
    assert [t["response_id"] for t in r["slowest"]] == ["resp_a", "resp_b", "resp_c"]
    assert r["slowest"][0]["engine"]["to_first_token"] == 420.0
    assert r["slowest"][0]["engine"]["talker_frames"] == 300.0 and r["slowest"][0]["engine"]["after"] == 12.0
    assert r["slowest"][0]["engine"]["to_talker"] == -2.0  # the hand-offs overlap: a part below 0 is kept
    assert r["slowest"][2]["engine"] is None  # its response logged no line
    assert r["turns"] == 14 and r["logged"] == 12
    assert r["slow_by_turn"] == {"1": 3}  # JSON keys: the turn index as text
    assert r["slow_by_tenth"] == [0, 0, 0, 0, 0, 0, 0, 0, 3, 0]  # 20-21 s of a 25 s span
    out = done.stdout
    assert "to_first_token 420" in out and "not in the log" in out and "by turn index: {1: 3}" in out
    # each turn's prompt and what of it was cached (a report older than that field: "-")
    assert "412 (0)" in out and "409 (380)" in out and out.count("  -  ") >= 1


def test_a_report_without_turns_is_refused_with_the_reason(tmp_path: Path) -> None:
    done = run_tool(tmp_path, {"kind": "chat"}, "")
    assert done.returncode == 2 and "no runs" in done.stderr
    done = run_tool(tmp_path, {"runs": {"on": {"summary": {}}}}, "")
    assert done.returncode == 2 and "lists no turns" in done.stderr
    done = run_tool(tmp_path, report_of([]), "", "--mode", "off")
    assert done.returncode == 2 and "no run 'off'" in done.stderr
    assert run_tool(tmp_path, report_of([]), "", "--top", "0").returncode == 2
