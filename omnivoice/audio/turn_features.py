"""The input of the end-of-turn model (smart_turn.py): Whisper-style log-mel features of the last 8 s
of a turn, in numpy.

The model was trained on what transformers' `WhisperFeatureExtractor(chunk_length=8)` makes of a clip
cut to its last 8 s, or padded with zeros in front to 8 s: the waveform normalized to zero mean and
unit variance (over the whole 8 s, padding included), a centred STFT (reflect padding, periodic Hann
window of 400 samples, hop 160), the power spectrum through 80 Slaney mel filters (0-8 kHz), log10
floored at 1e-10, the last frame dropped, values below the maximum minus 8 raised to it, and all
mapped by (x + 4) / 4. This module computes the same, in float64 as the reference does, without
transformers or torch.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

SAMPLE_RATE = 16000
WINDOW_SAMPLES = 8 * SAMPLE_RATE  # the model reads the last 8 s
N_FFT = 400
HOP = 160
N_MELS = 80
FRAMES = WINDOW_SAMPLES // HOP  # 800


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    hz = np.asarray(hz, dtype=np.float64)
    linear = 3.0 * hz / 200.0
    log = 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) * (27.0 / np.log(6.4))
    return np.where(hz >= 1000.0, log, linear)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    linear = 200.0 * mel / 3.0
    log = 1000.0 * np.exp((np.log(6.4) / 27.0) * (mel - 15.0))
    return np.where(mel >= 15.0, log, linear)


def mel_filters(n_fft: int = N_FFT, n_mels: int = N_MELS, rate: int = SAMPLE_RATE) -> np.ndarray:
    """Triangular mel filters [n_fft // 2 + 1, n_mels] with Slaney's area normalization."""
    edges = _mel_to_hz(np.linspace(_hz_to_mel(np.array(0.0)), _hz_to_mel(np.array(rate / 2)), n_mels + 2))
    bins = np.linspace(0, rate // 2, n_fft // 2 + 1)
    slopes = edges[None, :] - bins[:, None]  # [freq, n_mels + 2]
    widths = np.diff(edges)
    down = -slopes[:, :-2] / widths[:-1]
    up = slopes[:, 2:] / widths[1:]
    filters = np.maximum(0.0, np.minimum(down, up))
    return filters * (2.0 / (edges[2:] - edges[:-2]))[None, :]


class TurnFeatures:
    """The feature settings (window, filters), made once; calling it featurizes one clip."""

    def __init__(self) -> None:
        self._window = np.hanning(N_FFT + 1)[:-1]  # periodic, as torch.hann_window
        self._filters_t = mel_filters().T  # [n_mels, freq]

    def __call__(self, pcm: np.ndarray) -> np.ndarray:
        """Features [N_MELS, FRAMES] float32 of the last 8 s of `pcm` (mono float32 at 16 kHz)."""
        x = np.asarray(pcm, dtype=np.float32).reshape(-1)[-WINDOW_SAMPLES:]
        if x.size < WINDOW_SAMPLES:
            x = np.concatenate([np.zeros(WINDOW_SAMPLES - x.size, np.float32), x])
        x = (x - x.mean()) / np.sqrt(x.var() + 1e-7)  # float32, as the reference normalizes
        half = N_FFT // 2
        padded = np.pad(x.astype(np.float64), half, mode="reflect")
        frames = sliding_window_view(padded, N_FFT)[::HOP]  # [FRAMES + 1, N_FFT]
        # the frames that read only the zero padding in front (now one constant) are all alike: a
        # short turn's spectrum is computed for its own frames and one of those
        same = max(0, (WINDOW_SAMPLES - pcm.size - half) // HOP) if pcm.size < WINDOW_SAMPLES else 0
        first = max(same - 1, 0)
        power = np.abs(np.fft.rfft(frames[first:] * self._window, axis=-1)) ** 2  # [frames, freq]
        if first:
            power = np.concatenate([np.repeat(power[:1], first, axis=0), power])  # [FRAMES + 1, freq]
        log_mel = np.log10(np.maximum(self._filters_t @ power.T, 1e-10))[:, :-1]  # [n_mels, FRAMES]
        log_mel = np.maximum(log_mel, log_mel.max() - 8.0)
        return ((log_mel + 4.0) / 4.0).astype(np.float32)
