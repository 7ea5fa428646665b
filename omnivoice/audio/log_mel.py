"""Whisper-style log-mel features, as the thinker's audio encoder reads them: of a whole clip, or of a
clip still being spoken (`LogMelStream`), whose frames are computed as its audio arrives.

The math is transformers' `WhisperFeatureExtractor` (its torch path, unpadded, no dither): a centred
STFT (reflect padding), the power spectrum of every frame but the last through the mel filters, log10
floored at 1e-10, then values below the clip's maximum minus 8 raised to it and everything mapped by
(x + 4) / 4. A clip of n samples has n // hop frames.

Frame k reads samples [k * hop - n_fft / 2, k * hop + n_fft / 2): once those have arrived (and lie
before the clip's end) its log10 mel ("raw") value never changes, so a stream computes it then. Only
the last step needs the whole clip: the floor at its maximum minus 8, which is cheap.

`advance_streams` advances many streams at once: their new frames go through one FFT and one
product with the mel filters together, so a tick of many sessions costs a few tensor operations, not
a few per session.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view


class LogMel:
    """The feature settings of one model. `frames_computed` counts the frames this object has computed
    (whole clips and streams alike), so tests can tell that audio is featurized once."""

    def __init__(self, sample_rate: int, n_fft: int, hop: int, mel_filters: np.ndarray) -> None:
        self.sample_rate = sample_rate
        self.n_fft = n_fft
        self.hop = hop
        self.filters = torch.from_numpy(np.asarray(mel_filters)).to(torch.float32)  # [freq, mels]
        self.window = torch.hann_window(n_fft)
        self.frames_computed = 0
        self._count = threading.Lock()

    @classmethod
    def of(cls, extractor: Any) -> LogMel:
        """The settings of a transformers `WhisperFeatureExtractor`."""
        if getattr(extractor, "dither", 0.0):
            raise ValueError("a feature extractor with dither is not deterministic; set dither to 0")
        return cls(extractor.sampling_rate, extractor.n_fft, extractor.hop_length, extractor.mel_filters)

    @property
    def n_mels(self) -> int:
        return self.filters.shape[1]

    @property
    def min_samples(self) -> int:
        """The shortest clip that has a frame: more samples than the STFT's centring pads."""
        return self.n_fft // 2 + 1

    def __call__(self, pcm: np.ndarray) -> np.ndarray:
        """Log-mel features [n_mels, len(pcm) // hop] float32 of a whole clip (mono float32)."""
        self._check(pcm)
        wave = torch.from_numpy(np.ascontiguousarray(pcm, dtype=np.float32))[None]  # [1, n], as transformers
        stft = torch.stft(wave, self.n_fft, self.hop, window=self.window, return_complex=True)
        raw = self._log_mel(stft[..., :-1])[0]
        return finish(raw)

    def stream(self) -> LogMelStream:
        """An empty stream: a clip's features computed as its audio arrives."""
        return LogMelStream(self)

    def raw_frames(self, padded: torch.Tensor) -> torch.Tensor:
        """log10 mel [n_mels, frames] of every whole frame of an already padded signal."""
        stft = torch.stft(
            padded[None], self.n_fft, self.hop, window=self.window, center=False, return_complex=True
        )
        return self._log_mel(stft)[0]

    def raw_windows(self, frames: np.ndarray) -> torch.Tensor:
        """log10 mel [n_mels, K] of K frames [K, n_fft], each the n_fft samples of a padded signal that
        one frame reads (as `raw_frames` frames a signal itself)."""
        spectrum = torch.fft.rfft(torch.from_numpy(frames) * self.window, dim=-1)  # [K, freq]
        return self._log_mel(spectrum.T[None])[0]

    def _log_mel(self, stft: torch.Tensor) -> torch.Tensor:
        power = (stft.abs() ** 2).contiguous()  # [1, freq, frames]
        with self._count:
            self.frames_computed += power.shape[-1]
        # filters.T as transformers multiplies (a transposed view: the same kernels, the same bits)
        return torch.clamp(self.filters.T @ power, min=1e-10).log10()

    def _check(self, pcm: np.ndarray) -> None:
        if pcm.ndim != 1:
            raise ValueError(f"audio must be mono 1-D PCM, got shape {pcm.shape}")
        if pcm.size < self.min_samples:
            ms = 1000 * self.min_samples / self.sample_rate
            raise ValueError(f"audio is shorter than one feature frame ({ms:g} ms)")


def finish(raw: torch.Tensor, top: torch.Tensor | None = None) -> np.ndarray:
    """Features from log10 mel values: floored at the maximum (`top`, default raw's) minus 8, mapped
    by (x + 4) / 4, as float32 numpy."""
    top = raw.max() if top is None else top
    return ((torch.maximum(raw, top - 8.0) + 4.0) / 4.0).numpy()


class LogMelStream:
    """A clip's features, computed while it grows: `extend` adds audio, `advance(safe)` computes every
    frame that reads only the first `safe` samples (the clip is known to be at least that long), and
    `finish(clip)` computes the rest from the final clip and returns its features. Not thread-safe:
    one caller at a time."""

    def __init__(self, log_mel: LogMel) -> None:
        self.log_mel = log_mel
        self._audio: list[np.ndarray] = []  # received samples from `_base` on (earlier ones are done)
        self._base = 0
        self._received = 0
        self._blocks: list[torch.Tensor] = []  # raw frames, in order: each [n_mels, k]
        self.frames = 0  # raw frames computed
        self._top: torch.Tensor | None = None  # their maximum

    def extend(self, pcm: np.ndarray) -> None:
        if pcm.size:
            self._audio.append(np.asarray(pcm, dtype=np.float32))
            self._received += pcm.size

    def _samples(self) -> np.ndarray:
        """The samples from `_base` on, as one array."""
        if len(self._audio) != 1:
            self._audio = [np.concatenate(self._audio) if self._audio else np.zeros(0, np.float32)]
        return self._audio[0]

    def _trim(self) -> None:
        """Drop the samples no frame still to compute reads."""
        keep = max(0, self.frames * self.log_mel.hop - self.log_mel.n_fft // 2)
        if keep > self._base:
            self._audio = [self._samples()[keep - self._base :]]
            self._base = keep

    def advance(self, safe: int) -> int:
        """Compute the frames that read only samples before `safe` (<= the audio received); returns the
        number of frames computed so far."""
        piece = self.pending(safe)
        if piece is not None:
            self.take(self.log_mel.raw_frames(torch.from_numpy(np.ascontiguousarray(piece))))
        return self.frames

    def pending(self, safe: int) -> np.ndarray | None:
        """The padded audio [(k - 1) * hop + n_fft] of the k frames `advance(safe)` would compute next,
        for whoever computes them (`take` them back); None when there are none."""
        lm, half = self.log_mel, self.log_mel.n_fft // 2
        safe = min(safe, self._received)
        end = (
            (safe - half) // lm.hop + 1 if safe >= lm.min_samples else 0
        )  # frames k with k*hop + half <= safe
        if end <= self.frames:
            return None
        x, base = self._samples(), self._base
        # frame k reads the left-padded signal at [k * hop, k * hop + n_fft); the left pad reflects x
        first = self.frames * lm.hop - half
        if first < 0:  # nothing trimmed yet: base is 0
            piece = np.concatenate([x[1 : half + 1][::-1], x[:safe]])[self.frames * lm.hop :]
        else:
            piece = x[first - base : safe - base]
        return piece[: (end - self.frames - 1) * lm.hop + lm.n_fft]

    def take(self, raw: torch.Tensor, top: torch.Tensor | None = None) -> None:
        """The log10 mel values [n_mels, k] (with their maximum `top`, if known) of the frames
        `pending` gave the audio of: they are computed."""
        self._add(raw, top)
        self._trim()

    def _add(self, raw: torch.Tensor, top: torch.Tensor | None = None) -> None:
        if raw.shape[1] == 0:
            return
        self._blocks.append(raw)
        self.frames += raw.shape[1]
        top = raw.max() if top is None else top
        self._top = top if self._top is None else torch.maximum(self._top, top)

    def fork(self, samples: int) -> LogMelStream:
        """A stream of this clip's first `samples` samples (where it may end), holding the frames
        computed so far that read only those: finish it with that clip, advance it no further. This
        stream goes on."""
        lm = self.log_mel
        valid = (samples - lm.n_fft // 2) // lm.hop + 1 if samples >= lm.min_samples else 0
        out = LogMelStream(lm)
        out._received = samples
        keep = min(self.frames, valid)
        if keep:
            out._add(torch.cat(self._blocks, dim=1)[:, :keep])
        return out

    def features(self, start: int, end: int) -> np.ndarray:
        """Features of computed frames [start, end), floored at the maximum so far: what the finished
        clip's frames will be unless a louder frame comes later."""
        if end > self.frames or start >= end:
            raise ValueError(f"frames [{start}, {end}) are not computed ({self.frames} are)")
        assert self._top is not None
        raw = torch.cat(self._blocks, dim=1)[:, start:end]
        return finish(raw, self._top)

    def finish(self, clip: np.ndarray) -> np.ndarray:
        """The features of `clip`, which must begin with the audio this stream was given: the frames
        computed so far, the rest computed now."""
        lm, half = self.log_mel, self.log_mel.n_fft // 2
        lm._check(clip)
        total = clip.size // lm.hop
        if self.frames and (self.frames - 1) * lm.hop + half > clip.size:
            raise ValueError("the clip is shorter than the audio already featurized")
        if total > self.frames:
            padded = np.pad(np.asarray(clip, dtype=np.float32), half, mode="reflect")
            piece = padded[self.frames * lm.hop : (total - 1) * lm.hop + lm.n_fft]
            self._add(lm.raw_frames(torch.from_numpy(np.ascontiguousarray(piece))))
        raw = torch.cat(self._blocks, dim=1)[:, :total]
        return finish(raw)


def advance_streams(work: list[tuple[LogMelStream, int]]) -> None:
    """`stream.advance(safe)` for every (stream, safe) pair, the new frames of all the streams (of
    each `LogMel`) computed together. The streams must be distinct."""
    groups: dict[int, list[tuple[LogMelStream, np.ndarray]]] = {}
    for stream, safe in work:
        piece = stream.pending(safe)
        if piece is not None:
            lm = stream.log_mel
            frames = sliding_window_view(piece, lm.n_fft)[:: lm.hop]  # [k, n_fft], views of the piece
            groups.setdefault(id(lm), []).append((stream, frames))
    for group in groups.values():
        lm = group[0][0].log_mel
        raw = lm.raw_windows(np.concatenate([frames for _, frames in group])).numpy()  # [n_mels, K]
        tops = raw.max(axis=0)  # [K]
        at = 0
        for stream, frames in group:
            k = frames.shape[0]
            block = torch.from_numpy(np.ascontiguousarray(raw[:, at : at + k]))  # a copy: raw is freed
            stream.take(block, torch.from_numpy(tops[at : at + k].max(keepdims=True))[0])
            at += k
