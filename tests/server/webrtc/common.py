"""Shared by the WebRTC and page tests: the tiny model behind a real server, espeak-ng speech."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soxr

from omnivoice.audio import decode_wav, encode_wav
from tests.support.serve import serve_tiny  # noqa: F401  (re-exported for the WebRTC tests)


def fixed(tokens: int, frames: int, **session: Any) -> dict[str, Any]:
    """Session settings fixing the random model's output lengths (`frames` talker frames of 80 ms)."""
    return {
        "type": "realtime", "max_output_tokens": tokens,
        "omnivoice": {"min_output_tokens": tokens, "output_audio_frames": frames}, **session,
    }  # fmt: skip


def speak(text: str, folder: Path) -> tuple[np.ndarray, int]:
    """`text` spoken by espeak-ng: float32 mono and its sample rate."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng)")
    path = folder / f"{abs(hash(text))}.wav"
    subprocess.run(["espeak-ng", "-w", str(path), text], check=True, capture_output=True)
    return decode_wav(path.read_bytes())


def speech_wav(parts: list[str | float], folder: Path, rate: int = 48000) -> Path:
    """A WAV at `rate` of `parts`, texts spoken and silences (seconds): a fake microphone for Chromium."""
    audio = []
    for part in parts:
        if isinstance(part, str):
            pcm, src = speak(part, folder)
            audio.append(soxr.resample(pcm, src, rate).astype(np.float32))
        else:
            audio.append(np.zeros(int(part * rate), np.float32))
    path = folder / f"speech-{rate}.wav"
    path.write_bytes(encode_wav(np.concatenate(audio), rate))
    return path
