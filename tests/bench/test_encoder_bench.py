"""`omnivoice bench encoder`: the audio encoder timed per utterance and batched, on the tiny checkpoint;
the tower of a (shrunk) dummy model built alone."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import yaml

from omnivoice.bench.encoder_cli import build_tower
from omnivoice.cli import main
from omnivoice.models.dummy import REDUCED, DummySource
from omnivoice.runners.audio_encoder import AudioEncoder


def test_cli_times_every_mode_and_writes_json(tiny_checkpoint: Path, tmp_path: Path, capsys) -> None:
    profile = tmp_path / "tiny.yaml"
    profile.write_text(yaml.safe_dump({"model": {"path": str(tiny_checkpoint)}}))
    out = tmp_path / "encoder.json"
    argv = ["bench", "encoder", "--profile", str(profile), "--seconds", "1.5", "8.5", "--batch", "1", "3"]
    assert main([*argv, "--repeats", "1", "--warmups", "0", "--output-json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["model"] == str(tiny_checkpoint)
    cases = [(r["seconds"], r["batch"]) for r in report["results"]]
    assert cases == [(1.5, 1), (1.5, 3), (8.5, 1), (8.5, 3)]
    for r in report["results"]:
        assert r["per_utterance_ms"] > 0 and r["packed_ms"] > 0 and r["batched_ms"] > 0
        assert "batched_graphs_ms" not in r  # CUDA only
        assert r["max_abs_diff"] < 1e-5
    captured = capsys.readouterr()
    assert "ms per batch" in captured.out and "3 utterance(s) of 8.5 s" in captured.err


def test_bad_options_exit_2(capsys) -> None:
    assert main(["bench", "encoder", "--seconds", "0"]) == 2
    assert "--seconds" in capsys.readouterr().err


def test_a_dummy_models_tower_is_built_alone_and_encodes_as_transformers() -> None:
    tower = build_tower(DummySource("qwen3-omni-30b-a3b", overrides=REDUCED), "cpu", torch.float32)
    mel = torch.randn(128, 950, generator=torch.Generator().manual_seed(0))
    (ours,) = AudioEncoder(tower, torch.device("cpu"), max_windows=2).encode_clips([mel])
    with torch.no_grad():
        ref = tower(mel, feature_lens=torch.tensor([950])).last_hidden_state
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
