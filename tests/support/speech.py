"""Speech for the realtime tests: espeak-ng saying a text, audio as the clients send it, and session
settings that fix the random-weight model's output lengths."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soxr

from omnivoice.audio import decode_wav, encode_wav

RATE = 24000  # the realtime API's pcm16 rate


def speak(text: str, folder: Path, rate: int = RATE) -> np.ndarray:
    """`text` spoken by espeak-ng, as float32 mono at `rate` (the WAV is kept in `folder`)."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng)")
    path = folder / f"{abs(hash(text))}.wav"
    if not path.exists():
        subprocess.run(["espeak-ng", "-w", str(path), text], check=True, capture_output=True)
    pcm, src = decode_wav(path.read_bytes())
    return soxr.resample(pcm, src, rate).astype(np.float32)


def pcm16(*parts: np.ndarray | float) -> bytes:
    """Concatenate audio (arrays) and silences (floats, seconds) as 24 kHz pcm16 bytes."""
    chunks = [np.zeros(int(p * RATE), np.float32) if isinstance(p, float | int) else p for p in parts]
    x = np.concatenate(chunks)
    return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


def speech_wav(parts: list[str | float], folder: Path, rate: int = 48000) -> Path:
    """A WAV at `rate` of `parts`, texts spoken and silences (seconds): a fake microphone for Chromium."""
    audio = [
        speak(part, folder, rate) if isinstance(part, str) else np.zeros(int(part * rate), np.float32)
        for part in parts
    ]
    path = folder / f"speech-{rate}.wav"
    path.write_bytes(encode_wav(np.concatenate(audio), rate))
    return path


def fixed(tokens: int, frames: int, **session: Any) -> dict[str, Any]:
    """Session settings (a `session.update` object) fixing the random model's output lengths: `tokens`
    text tokens and `frames` talker frames of 80 ms."""
    return {
        "type": "realtime", "max_output_tokens": tokens,
        "omnivoice": {"min_output_tokens": tokens, "output_audio_frames": frames}, **session,
    }  # fmt: skip


def fixed_call(tokens: int, frames: int, **parameters: Any) -> dict[str, Any]:
    """`fixed`, as a Twilio call's customParameters (the TwiML's <Parameter>s)."""
    lengths = {"max_output_tokens": tokens, "min_output_tokens": tokens, "output_audio_frames": frames}
    return {**lengths, **parameters}
