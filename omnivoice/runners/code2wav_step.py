"""One Code2Wav forward over a group of windows, at fixed shapes on a GPU (eager or a CUDA graph).

Code2Wav is causal in time: its pre-transformer attends to the left only (a causal sliding window),
its convolutions are left-padded, and each transposed convolution's output sample reads only the
input samples it overlaps, the last `kernel - stride` outputs being trimmed. A decode of n frames
yields n * upsample - lost samples (lost: 555 for the real vocoder), and appending frames on the
right changes none of them. So a window can be right-padded with zero codes to a longer length L
and its own samples are the first n * upsample - lost ones, i.e. all but the last (L - n) * upsample
of the padded output. (Checked on the tiny checkpoint in tests/runners/test_code2wav_step.py.)

On a GPU windows are padded to the few window lengths the chunking produces (`window_lengths`) and
rows to a batch bucket (padding rows are zero codes, dropped), so a step has one of a small set of
shapes; with `execution: cuda_graph` each is captured once at start and replayed with one launch
instead of ~1,000 kernel launches from Python. Eager execution on the GPU pads to the same shapes,
so both give identical samples. On the CPU windows are decoded at their exact size.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import numpy as np
import torch

from omnivoice.runners.graph_backlog import GraphBacklog
from omnivoice.runners.graphs import StepGraphs, bucket, power_buckets
from omnivoice.runners.transfer import to_device

log = logging.getLogger(__name__)


@contextmanager
def cudnn_autotuning(enabled: bool = True, limit: int | None = None) -> Iterator[None]:
    """cuDNN benchmarks its convolution algorithms for each new shape while this is open (`enabled`),
    trying at most `limit` of them per shape (None: torch's setting, 0: all).

    The chosen algorithm is cached per shape and used afterwards with the flag off too, so warming up
    every shape here fixes the algorithms of later eager decodes and graphs (cuDNN's heuristic picked
    a slow implicit-GEMM convolution at batch 32). The flags are process-wide: open this only while no
    other stage runs (when the runners are built).
    """
    before = torch.backends.cudnn.benchmark, torch.backends.cudnn.benchmark_limit
    torch.backends.cudnn.benchmark = enabled
    if limit is not None:
        torch.backends.cudnn.benchmark_limit = limit
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.benchmark_limit = before


class Code2WavStep:
    """Decodes windows of codec frames to waveforms: codes [G, n_i] per row -> samples per row."""

    def __init__(
        self,
        code2wav: Any,
        windows: tuple[int, ...],
        max_batch: int,
        device: torch.device,
        graphs: bool,
        pad: bool | None = None,
        tune_from_batch: int = 1,
        benchmark_limit: int | None = None,
    ) -> None:
        """`tune_from_batch`: the smallest batch bucket whose shapes cuDNN times at start (smaller ones
        take its heuristic's algorithms); `benchmark_limit`: algorithms timed per shape."""
        self.model = code2wav
        self.tune_from_batch = tune_from_batch
        self.benchmark_limit = benchmark_limit
        self.device = device
        self.upsample = int(code2wav.total_upsample)
        self.groups = int(code2wav.config.num_quantizers)
        self.pad = device.type == "cuda" if pad is None else pad  # padding on CPU: tests only
        self.windows = windows
        # powers of two: every shape is timed by cuDNN at start, and a Code2Wav step is cheap next to
        # the decoders', so fewer shapes with more padding rows start faster
        self.batch_sizes = power_buckets(max_batch)
        self.graphs = StepGraphs(self._fn, "code2wav", enabled=graphs)

    def frames(self, n: int) -> int:
        """Frames a window of n frames is decoded as (the next window length when padding)."""
        return bucket(n, self.windows) if self.pad else n

    def rows(self, n: int) -> int:
        """Rows a forward of n windows runs (its batch bucket when padding)."""
        return bucket(n, self.batch_sizes) if self.pad else n

    def __call__(self, windows: list[np.ndarray]) -> list[np.ndarray]:
        """windows: int64 [G, n_i] each, all with the same `frames(n_i)` -> float32 [n_i * upsample -
        lost] each: exactly what a decode of that window alone gives (to float rounding)."""
        lengths = {self.frames(w.shape[1]) for w in windows}
        if len(lengths) != 1:
            raise ValueError(f"windows of {sorted(lengths)} padded frames cannot share a forward")
        frames = lengths.pop()
        codes = np.zeros((self.rows(len(windows)), self.groups, frames), dtype=np.int64)  # [R, G, L]
        for row, window in enumerate(windows):
            codes[row, :, : window.shape[1]] = window
        out = self._run(to_device(torch.from_numpy(codes), self.device))  # [R, samples of L frames]
        wav = out[: len(windows)].float().cpu().numpy()
        cut = [(frames - w.shape[1]) * self.upsample for w in windows]  # samples of the padding frames
        return [row[: wav.shape[1] - c] for row, c in zip(wav, cut, strict=True)]

    def warm_up(self, widest: int | None = None, backlog: GraphBacklog | None = None) -> None:
        """Run every (batch bucket, window length) shape once, capturing its CUDA graph when graphs are
        on, so nothing is tuned or captured while serving; cuDNN times its algorithms for the shapes of
        batches from `tune_from_batch` on. Largest first: later, smaller captures reuse the graph
        pool's memory. With `widest` and `backlog` (graphs on), only the buckets up to `widest` rows
        are run here; the wider ones are left in `backlog`, narrowest first, each tuned and captured
        when the stage is idle or a step first needs it (cuDNN's timing of the wide shapes is most of
        this warm-up)."""
        if not (self.pad and self.device.type == "cuda"):
            return
        began = time.perf_counter()
        now = [n for n in self.batch_sizes if widest is None or backlog is None or n <= widest]
        if not self.graphs.enabled:
            now = list(self.batch_sizes)  # eager: nothing to capture later, every shape tuned now
        for rows in reversed(now):
            for frames in reversed(self.windows):
                self._warm_shape(rows, frames)
        if backlog is not None:
            for rows in (n for n in self.batch_sizes if n not in now):
                for frames in self.windows:
                    backlog.add(self.graphs, (rows, frames), partial(self._warm_shape, rows, frames))
        torch.cuda.synchronize(self.device)
        graphs = len(self.graphs.captured)
        what = f"{graphs} CUDA graphs captured" if self.graphs.enabled else "every shape warmed up (eager)"
        tuned = [n for n in now if n >= self.tune_from_batch]
        later = len(self.batch_sizes) - len(now)
        log.info(
            "code2wav: %s in %.1f s (batch %s x window frames %s; cuDNN tuned batches %s)%s",
            what,
            time.perf_counter() - began,
            now,
            list(self.windows),
            tuned,
            f"; {later * len(self.windows)} graphs of wider batches left for when the stage is idle"
            if later
            else "",
        )

    @torch.inference_mode()
    def _warm_shape(self, rows: int, frames: int) -> None:
        """Decode one padding batch of this shape: cuDNN times its convolutions (batches from
        `tune_from_batch` on) and its graph is captured. cuDNN's flags are process-wide: beside stage
        threads of the same process, their convolutions may be timed too while this runs."""
        with cudnn_autotuning(rows >= self.tune_from_batch, self.benchmark_limit):
            self._run(torch.zeros(rows, self.groups, frames, dtype=torch.long, device=self.device))

    def _run(self, codes: torch.Tensor) -> torch.Tensor:
        rows, _, frames = codes.shape
        return self.graphs((rows, frames), {"codes": codes})[0]

    def _fn(self, codes: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.model(codes)[:, 0],)  # [R, G, L] -> [R, samples]
