"""The end-of-turn benchmark's clips (benchmarks/turn_clips: espeak-ng questions, complete or broken by
a pause), for tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import soxr

from omnivoice.audio import decode_wav

CLIPS = Path(__file__).parents[2] / "benchmarks" / "turn_clips"


def manifest(name: str) -> dict[str, Any]:
    """The manifest's entry of clip `name` (e.g. "broken/02.wav"); a broken clip's `pause` is
    [start, end) in samples at 16 kHz."""
    clips = json.loads((CLIPS / "clips.json").read_text())["clips"]
    return next(c for c in clips if c["file"] == name)


def clip(name: str, rate: int = 16000) -> np.ndarray:
    """Clip `name` as float32 mono at `rate`."""
    pcm, src = decode_wav((CLIPS / name).read_bytes())
    return pcm if src == rate else soxr.resample(pcm, src, rate).astype(np.float32)
