"""Streaming resamplers: one per stream direction, so chunk edges join without clicks or drift.

`StreamResampler` is soxr's stream at any pair of rates. soxr filters in blocks, so it holds part of
what it was given back until a block is full, most of all when it upsamples 8 kHz appends
(benchmarks/resample_holdback.py measures it). On a caller's input that is how late the VAD hears
the end of a turn. `HalfBandUpsampler` doubles a rate (8 kHz G.711 to the model's 16 kHz) with a
fixed delay of HALF_BAND_DELAY input samples instead: a half-band FIR, whose even outputs are its
input itself and whose odd ones a 48-tap filter makes, per chunk as it comes. `input_resampler`
picks it for a caller's audio where the rates allow.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import soxr

HALF_BAND_DELAY = 24  # input samples the half-band upsampler holds back (3 ms at 8 kHz)
HALF_BAND_BETA = 8.0  # Kaiser window: about 80 dB of image rejection


class Resampler(Protocol):
    in_rate: int
    out_rate: int

    def process(self, pcm: np.ndarray) -> np.ndarray: ...

    def flush(self) -> np.ndarray: ...

    def reset(self) -> None: ...


def input_resampler(in_rate: int, out_rate: int) -> Resampler:
    """The resampler of a caller's audio: the half-band upsampler where `out_rate` is twice
    `in_rate` (no block hold-back), else soxr's stream."""
    if out_rate == 2 * in_rate:
        return HalfBandUpsampler(in_rate)
    return StreamResampler(in_rate, out_rate)


class StreamResampler:
    """Mono float32 resampling across chunks (soxr.ResampleStream); identity when the rates match.

    soxr keeps filter history between chunks, so the output equals resampling the whole stream at
    once, delayed by a few milliseconds. `flush()` returns that held-back tail and resets the stream.
    """

    def __init__(self, in_rate: int, out_rate: int, quality: str = "HQ") -> None:
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._quality = quality
        self._stream = (
            None if in_rate == out_rate else soxr.ResampleStream(in_rate, out_rate, 1, "float32", quality)
        )

    def process(self, pcm: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(pcm, dtype=np.float32).reshape(-1)
        if self._stream is None:
            return x
        return self._stream.resample_chunk(x)

    def flush(self) -> np.ndarray:
        """The samples still held in the filter; the stream starts afresh afterwards."""
        if self._stream is None:
            return np.zeros(0, np.float32)
        tail = self._stream.resample_chunk(np.zeros(0, np.float32), last=True)
        self._stream.clear()
        return tail

    def reset(self) -> None:
        """Drop whatever is held (e.g. the rest of a cancelled response)."""
        if self._stream is not None:
            self._stream.clear()


class HalfBandUpsampler:
    """Mono float32 at `in_rate` to twice that rate, across chunks, time-aligned with its input: the
    output of every chunk is ready at once but for the last HALF_BAND_DELAY input samples' worth,
    which the next chunk (or `flush`) brings. Any chunking gives the same samples as one call on
    the whole stream.

    The interpolation filter is a Kaiser-windowed half-band lowpass of 4 * HALF_BAND_DELAY + 1 taps
    at the output rate: its passband reaches about 0.45 of the input rate (3.6 kHz at 8 kHz, the
    telephone band and a little more), its images are about 80 dB down."""

    def __init__(self, in_rate: int) -> None:
        self.in_rate = in_rate
        self.out_rate = 2 * in_rate
        d = HALF_BAND_DELAY
        m = np.arange(4 * d + 1) - 2 * d  # taps around the centre, at the output rate
        taps = np.sinc(m / 2) * np.kaiser(m.size, HALF_BAND_BETA)  # gain 2: the zeros stuffed in
        # y[2i + 1] = sum_k taps[2k + 1] x[i - k]: the odd taps, applied as a convolution
        self._odd = taps[1::2].astype(np.float32)  # 2 * d of them
        self._history = np.zeros(self._odd.size - 1, np.float32)
        self._skip = 2 * d  # outputs still to drop at the start: the filter's delay

    def process(self, pcm: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(pcm, dtype=np.float32).reshape(-1)
        if not x.size:
            return np.zeros(0, np.float32)
        ext = np.concatenate([self._history, x])
        self._history = ext[-(self._odd.size - 1) :]
        d = HALF_BAND_DELAY
        out = np.empty(2 * x.size, np.float32)
        out[0::2] = ext[self._odd.size - 1 - d : ext.size - d]  # the centre tap (1): x delayed by d
        out[1::2] = np.convolve(ext, self._odd, mode="valid")
        if self._skip:
            dropped = min(self._skip, out.size)
            self._skip -= dropped
            out = out[dropped:]
        return out

    def flush(self) -> np.ndarray:
        """The samples still held back (all of them once the stream had HALF_BAND_DELAY samples);
        the stream starts afresh afterwards."""
        held = 2 * HALF_BAND_DELAY - self._skip
        tail = self.process(np.zeros(HALF_BAND_DELAY, np.float32))[:held] if held else np.zeros(0, np.float32)
        self.reset()
        return tail

    def reset(self) -> None:
        """Drop whatever is held; the next chunk starts a new stream."""
        self._history = np.zeros(self._odd.size - 1, np.float32)
        self._skip = 2 * HALF_BAND_DELAY
