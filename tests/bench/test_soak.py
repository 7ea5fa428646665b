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

from omnivoice.bench.soak_cli import add_arguments, run
from omnivoice.bench.soak_report import growth
from tests.support.serve import serve_tiny

NO_ESPEAK = shutil.which("espeak-ng") is None


@pytest.mark.skipif(NO_ESPEAK, reason="espeak-ng is not installed")
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
        assert server["memory_growth"][name]["sessions_after_warmup"] > 0, name
    assert report["latency"]["voice_to_voice_ms"]["n"] >= 10


def test_memory_growth_is_the_slope_per_session_after_the_warmup() -> None:
    def sample(t: float, opened: int, server_mb: float) -> dict:
        return {"t": t, "sessions_opened": opened, "processes": {"server": {"rss_mb": server_mb}}}

    # 1 MB per session during the warm-up (the first 10 s), then 0.1 MB (102.4 KB) per session
    samples = [sample(t, 10 * t, 400 + 10 * t) for t in range(10)]
    samples += [sample(t, 10 * t, 500 + (10 * t - 100) * 0.1) for t in range(10, 31)]
    samples.append(sample(40, 300, 900))  # after the load (settling): left out
    g = growth(samples, warmup_s=10, load_s=30)["server"]
    assert g == {
        "warmup_s": 10,
        "sessions_after_warmup": 200,
        "rss_after_warmup_mb": 500,
        "rss_load_end_mb": 520,
        "kb_per_session": 102.4,
    }
