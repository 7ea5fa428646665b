"""A streaming resampler: one per stream direction, so chunk edges join without clicks or drift."""

from __future__ import annotations

import numpy as np
import soxr


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
