"""`omnivoice bench parity`: the PCM comparison, and a whole run on the CPU (eager twice)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import yaml

from omnivoice.bench.parity import add_arguments, compare_pcm, run


def test_compare_pcm_finds_the_first_sample_past_the_tolerance() -> None:
    a = np.arange(10, dtype=np.float32)
    assert compare_pcm(a, a.copy())["pcm_equal"]
    assert compare_pcm(None, None) == {
        "pcm_samples": 0,
        "pcm_equal": True,
        "pcm_max_abs_diff": 0.0,
        "first_pcm_difference": None,
    }
    b = a.copy()
    b[[3, 7]] += np.float32([1e-3, 0.5])
    exact = compare_pcm(a, b)
    assert not exact["pcm_equal"] and exact["first_pcm_difference"] == 3
    assert abs(exact["pcm_max_abs_diff"] - 0.5) < 1e-6
    assert compare_pcm(a, b, atol=0.01)["first_pcm_difference"] == 7
    assert compare_pcm(a, b, atol=0.6)["pcm_equal"]
    shorter = compare_pcm(a, a[:8])  # a missing tail differs where it starts
    assert not shorter["pcm_equal"] and shorter["first_pcm_difference"] == 8
    assert not compare_pcm(a, None)["pcm_equal"]


def test_parity_compares_tokens_frames_and_pcm(tiny_checkpoint: Path, tmp_path: Path) -> None:
    stage = {"worker": "thread", "max_seq_len": 512}
    profile = tmp_path / "profile.yaml"
    profile.write_text(
        yaml.safe_dump(
            {
                "model": {"path": str(tiny_checkpoint)},
                "stages": {"thinker": stage, "talker": stage, "code2wav": {"worker": "thread"}},
            }
        )
    )
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out = tmp_path / "parity.json"
    sizes = ["--requests", "2", "--text-tokens", "6", "--audio-frames", "30"]
    args = parser.parse_args(["--profile", str(profile), *sizes, "--output-json", str(out)])
    assert run(args) == 0
    report = json.loads(out.read_text())
    assert report["identical"] and report["modes"] == ["eager", "eager again"]
    assert all(steps[2] > 0 for steps in report["steps"].values())  # code2wav ran in both modes
    for r in report["requests"]:
        assert r["frames"] == 30 and r["pcm_samples"] == 30 * 1920 - 555 and r["pcm_equal"]
