"""cuDNN tuning of Code2Wav's shapes at start: process-wide flags set while warming up, then put back."""

from __future__ import annotations

import pytest
import torch

from omnivoice.config import Code2WavStage
from omnivoice.runners.code2wav_step import cudnn_autotuning


def test_tuning_flags_hold_inside_and_are_restored_after() -> None:
    before = torch.backends.cudnn.benchmark, torch.backends.cudnn.benchmark_limit
    with cudnn_autotuning(True, 3):
        assert torch.backends.cudnn.benchmark is True and torch.backends.cudnn.benchmark_limit == 3
    with cudnn_autotuning(False):  # heuristics only; the limit left as it was
        assert torch.backends.cudnn.benchmark is False and torch.backends.cudnn.benchmark_limit == before[1]
    with pytest.raises(RuntimeError), cudnn_autotuning(True, 1):
        raise RuntimeError("a warm-up that fails")
    assert (torch.backends.cudnn.benchmark, torch.backends.cudnn.benchmark_limit) == before


def test_tuning_settings_default_to_every_shape_with_three_algorithms() -> None:
    cfg = Code2WavStage()
    assert cfg.cudnn_tune_from_batch == 1 and cfg.cudnn_benchmark_limit == 3
    with pytest.raises(ValueError, match="cudnn_tune_from_batch"):
        Code2WavStage(cudnn_tune_from_batch=0)
