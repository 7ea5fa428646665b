"""The realtime wire formats: 24 kHz pcm16, and 8 kHz G.711 u-law / A-law, to and from float32 PCM."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from omnivoice.audio.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from omnivoice.audio.wav import AudioDecodeError, decode_pcm16, pcm16_bytes

FormatName = Literal["pcm16", "g711_ulaw", "g711_alaw"]


@dataclass(frozen=True)
class AudioFormat:
    """One wire format. `name` is the Realtime beta name; `mime` the GA `type`."""

    name: FormatName
    mime: str
    sample_rate: int
    bytes_per_sample: int

    def decode(self, data: bytes) -> np.ndarray:
        """Wire bytes -> mono float32 in [-1, 1] at `sample_rate`."""
        if self.name == "pcm16":
            if len(data) % 2:
                raise AudioDecodeError(f"pcm16 audio must have an even number of bytes, got {len(data)}")
            return decode_pcm16(data)
        pcm = ulaw_decode(data) if self.name == "g711_ulaw" else alaw_decode(data)
        return pcm.astype(np.float32) / 32768.0

    def encode(self, pcm: np.ndarray) -> bytes:
        """Mono float PCM at `sample_rate` -> wire bytes."""
        if self.name == "pcm16":
            return pcm16_bytes(pcm)
        x = np.nan_to_num(np.asarray(pcm, dtype=np.float32).reshape(-1), nan=0.0)
        ints = np.round(np.clip(x, -1.0, 1.0) * 32767.0).astype(np.int16)
        return ulaw_encode(ints) if self.name == "g711_ulaw" else alaw_encode(ints)

    def seconds(self, n_bytes: int) -> float:
        return n_bytes / (self.bytes_per_sample * self.sample_rate)


PCM16 = AudioFormat("pcm16", "audio/pcm", 24000, 2)
G711_ULAW = AudioFormat("g711_ulaw", "audio/pcmu", 8000, 1)
G711_ALAW = AudioFormat("g711_alaw", "audio/pcma", 8000, 1)
FORMATS: dict[str, AudioFormat] = {f.name: f for f in (PCM16, G711_ULAW, G711_ALAW)}
FORMATS_BY_MIME: dict[str, AudioFormat] = {f.mime: f for f in (PCM16, G711_ULAW, G711_ALAW)}
