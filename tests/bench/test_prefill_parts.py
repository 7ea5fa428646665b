"""benchmarks/prefill_parts.py (a GPU development tool) runs on the CPU's test-sized layer, and its
MoE candidates compute what transformers' experts do."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_prefill_parts_times_every_candidate_and_checks_the_moe_results(tmp_path: Path) -> None:
    out = tmp_path / "parts.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "prefill_parts.py"), "--reduced", "--device", "cpu"]
    cmd += ["--rows", "1", "3", "--tokens", "12", "--steps", "1", "--out", str(out)]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, timeout=300)
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["tokens"] == 12
    for rows in ("rows 1", "rows 3"):
        figures = report[rows]
        for part in ("moe_transformers", "moe_one_hot", "moe_sorted", "attention_batch_mask"):
            assert figures[f"{part}_ms"] > 0
        assert figures["moe_one_hot_max_abs_diff"] < 1e-4 and figures["moe_sorted_max_abs_diff"] < 1e-4
