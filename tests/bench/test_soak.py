"""`omnivoice bench soak`, short: a real server on loopback (the tiny model, each stage in its own
process, so requests cross shared memory) gets 20-30 abrupt disconnects, most of them mid-answer, plus
normal turns and barge-ins; afterwards it holds no more than at the baseline: no session, no engine
or stage request, no cached prefix or KV slot, no shared-memory segment, no extra fd or task."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest
from server.serve import serve_tiny

from omnivoice.bench.soak_cli import add_arguments, run

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")


def test_short_soak_leaks_nothing(tiny_checkpoint: Path, tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out = tmp_path / "soak.json"
    with serve_tiny(tiny_checkpoint, worker="process") as srv:
        args = parser.parse_args(
            ["--base-url", srv.base_url, "--concurrency", "6", "--disconnects", "20", "--duration", "60",
             "--turns", "1-3", "--barge-in", "0.15", "--disconnect", "0.7", "--within-s", "0.8",
             "--speech-text", "Hello there.", "--silence-ms", "300", "--max-output-tokens", "16",
             "--audio-frames", "30", "--sample-s", "1", "--window-s", "5", "--settle-s", "20",
             "--quiet", "--output-json", str(out)]
        )  # fmt: skip
        code = run(args)
    report = json.loads(out.read_text())
    c, server = report["client"], report["server"]
    assert c["abrupt_disconnects"] >= 20 and c["abrupt_disconnects_mid_response"] >= 10, c
    assert c["turns_completed"] >= 1 and c["barge_ins"] + c["barge_ins_late"] >= 1, c
    assert c["errors"] == {}, c
    assert report["leaks"] == {} and code == 0, report["leaks"]
    end = server["end"]
    drained = ("sessions", "reserved_slots", "engine_requests", "stage_requests", "prefixes", "kv_slots_used")
    assert {k: end[k] for k in drained} == dict.fromkeys(drained, 0)
    assert end["shm_segments"] == 0
    assert set(end["processes"]) == {"server", "thinker-0", "talker-0", "code2wav-0"}
    for name, m in server["memory"].items():
        assert m["fds_end"] <= m["fds_start"] + 4, name
    assert report["latency"]["voice_to_voice_ms"]["n"] >= 10
