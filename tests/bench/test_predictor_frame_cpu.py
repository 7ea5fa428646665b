"""benchmarks/predictor_frame_cpu.py times both kinds of CPU frame and finds the same codes in each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_predictor_frame_cpu_times_both_frames_and_checks_their_codes(tmp_path: Path) -> None:
    out = tmp_path / "frame.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "predictor_frame_cpu.py"), "--batch", "1", "2"]
    cmd += ["--rounds", "2", "--frames", "1", "--out", str(out)]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, timeout=300)
    report = json.loads(out.read_text())
    rows = {"batch 1 greedy", "batch 1 sampled", "batch 2 greedy", "batch 2 sampled", "batch 2 mixed"}
    assert rows <= set(report) and "batch 1 mixed" not in report
    for name in rows:
        assert report[name]["same_codes"] is True
        assert report[name]["fixed_ms_median"] > 0 and report[name]["exact_ms_median"] > 0
