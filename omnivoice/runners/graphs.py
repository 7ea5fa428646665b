"""Fixed-shape decode steps, run eagerly or replayed from CUDA graphs.

A decode step launches hundreds of small kernels (the code predictor's 15 sequential steps, 20 to 48
MoE layers); launched one by one from Python they cost far more than the GPU needs to run them. So
the steps are written with device tensors and fixed shapes only (no host sync, no Python per row):
a batch is padded up to a batch-size bucket and attention reads a KV-length bucket, and on a GPU with
`execution: cuda_graph` each (bucket, shape) is captured once and then replayed with one launch.
Eager execution on the GPU pads to the same buckets, so graphed and eager runs compute the same
kernels on the same shapes and give identical results.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

StepFn = Callable[..., tuple[torch.Tensor, ...]]


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """Batch sizes steps are padded to: 1, 2, 4, 8, every multiple of 8 up to 32, every multiple of 16
    past it, then max_batch. Each bucket is a graph (per KV bucket) captured at start; past 32 rows a
    decode step costs about the same with up to 15 padding rows (it reads the same weights), so the
    coarser steps save captures, not step time."""
    sizes = {n for n in (1, 2, 4, 8) if n < max_batch}
    sizes |= set(range(8, min(max_batch, 32), 8)) | set(range(32, max_batch, 16)) | {max_batch}
    return tuple(sorted(sizes))


def power_buckets(max_batch: int) -> tuple[int, ...]:
    """Batch sizes 1, 2, 4, ... up to max_batch (and max_batch itself)."""
    sizes = {max_batch}
    n = 1
    while n < max_batch:
        sizes.add(n)
        n *= 2
    return tuple(sorted(sizes))


def kv_buckets(max_len: int, smallest: int = 128) -> tuple[int, ...]:
    """KV lengths attention is padded to: powers of two from `smallest`, then max_len."""
    sizes = {max_len}
    n = smallest
    while n < max_len:
        sizes.add(n)
        n *= 2
    return tuple(sorted(sizes))


def bucket(n: int, sizes: tuple[int, ...]) -> int:
    """The smallest of `sizes` that holds n."""
    for size in sizes:
        if size >= n:
            return size
    raise ValueError(f"{n} exceeds the largest bucket {sizes[-1]}")


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: dict[str, torch.Tensor]
    outputs: tuple[torch.Tensor, ...]


class StepGraphs:
    """Runs `fn(**tensors, **static)`; with `enabled`, each distinct `key` is captured once as a CUDA graph.

    `key` must determine every input shape and every value in `static` (Python scalars baked into
    the graph, such as a KV-length bucket). Outputs are returned as fresh tensors.

    A key can be left for later (`defer`) with a call that captures it from padding inputs. A step
    that meets such a key first captures it through that call, never from its own inputs: a capture
    runs the function eagerly once before recording it, and a step's own rows would then update
    their per-slot state (KV positions, sampler counts) twice.

    Each instance captures on a stream of its own. cuBLAS keeps one workspace per (handle, stream),
    and a captured GEMM keeps the workspace it was captured with: graphs captured on one shared
    stream would all write the same workspace, and graphs of different stages replay at the same
    time on the stages' streams. The capture is thread-local (`capture_error_mode`), so another
    thread building its own graphs at the same time is not affected by it.

    A key whose capture fails (no memory left for its graph pool or a library's workspace, as after
    a restart beside a full GPU) runs eagerly from then on (`eager`) instead of failing every step
    that meets it. A step that meets a deferred key whose capture fails runs on eagerly; one whose
    own inputs a failed capture had already run fails, as its rows may have been stepped once.
    A device fault fails the eager run as well, so the stage still meets it.
    """

    def __init__(self, fn: StepFn, name: str, enabled: bool) -> None:
        self.fn = fn
        self.name = name
        self.enabled = enabled
        self.pool = torch.cuda.graph_pool_handle() if enabled else None
        self.captured: dict[Hashable, _Captured] = {}
        self.capture_s = 0.0
        self._deferred: dict[Hashable, Callable[[], object]] = {}  # key -> the call that captures it
        self.eager: set[Hashable] = set()  # keys whose capture failed: run eagerly
        self._streams: tuple[torch.cuda.Stream, torch.cuda.Stream] | None = None  # warm-up, capture

    def __call__(
        self, key: Hashable, inputs: dict[str, torch.Tensor], **static: int
    ) -> tuple[torch.Tensor, ...]:
        if not self.enabled or key in self.eager:
            return self.fn(**inputs, **static)
        entry = self.captured.get(key)
        if entry is None and key in self._deferred:
            with contextlib.suppress(Exception):  # a failure is logged, and the key left eager
                self.capture_deferred(key)
            entry = self.captured.get(key)
            if entry is None:  # the padding rows' capture failed; this step's rows are untouched
                return self.fn(**inputs, **static)
        if entry is None:
            entry = self._capture_or_leave_eager(key, inputs, static)
        for name, value in inputs.items():
            entry.inputs[name].copy_(value, non_blocking=True)
        entry.graph.replay()
        return tuple(out.clone() for out in entry.outputs)

    def defer(self, key: Hashable, capture: Callable[[], object]) -> None:
        """Leave `key` for later: `capture()` captures it (by calling this instance with padding
        inputs for `key`), at `capture_deferred(key)` or when a step first needs it."""
        if self.enabled and key not in self.captured:
            self._deferred[key] = capture

    def capture_deferred(self, key: Hashable) -> bool:
        """Capture a deferred `key` now; False if it was not deferred (or is captured already)."""
        capture = self._deferred.pop(key, None)
        if capture is None:
            return False
        capture()
        return True

    def is_deferred(self, key: Hashable) -> bool:
        return key in self._deferred

    def _capture_or_leave_eager(
        self, key: Hashable, inputs: dict[str, torch.Tensor], static: dict[str, int]
    ) -> _Captured:
        """Capture `key`; if that fails, leave it eager from now on and raise the failure."""
        try:
            return self._capture(key, inputs, static)
        except Exception as e:
            self.eager.add(key)
            log.warning(
                "%s: capturing the CUDA graph of %s failed (%s); it runs eagerly from now on",
                self.name,
                key,
                e,
            )
            raise

    def _capture(self, key: Hashable, inputs: dict[str, torch.Tensor], static: dict[str, int]) -> _Captured:
        began = time.perf_counter()
        buffers = {name: value.clone() for name, value in inputs.items()}
        self._warm_up(buffers, static)
        try:
            graph, outputs = self._record(buffers, static)
        except torch.OutOfMemoryError as e:
            # while a capture is under way the allocator cannot hand its cached blocks back to the
            # device, so a graph pool that needs a new segment fails even with memory cached (a
            # prefill's activations): release them and record once more (recording runs no kernel,
            # so the rows are not stepped again)
            if not self._release_cache(next(iter(buffers.values())).device):
                raise
            log.info(
                "%s: the CUDA graph of %s found no memory (%s); cached memory released, recording again",
                self.name,
                key,
                str(e).splitlines()[0],
            )
            graph, outputs = self._record(buffers, static)
        entry = _Captured(graph, buffers, tuple(outputs))
        self.captured[key] = entry
        took = time.perf_counter() - began
        self.capture_s += took
        log.debug("%s: captured CUDA graph %s in %.0f ms", self.name, key, took * 1e3)
        return entry

    def _streams_of(self, device: torch.device) -> tuple[torch.cuda.Stream, torch.cuda.Stream]:
        if self._streams is None:
            self._streams = (torch.cuda.Stream(device), torch.cuda.Stream(device))
        return self._streams

    def _warm_up(self, buffers: dict[str, torch.Tensor], static: dict[str, int]) -> None:
        """Run the function on a side stream first (library handles, autotuning): not captured."""
        device = next(iter(buffers.values())).device
        side, capture = self._streams_of(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(1 if self.captured else 2):  # a new shape of a warm function: one run
                self.fn(**buffers, **static)
        capture.wait_stream(side)

    def _record(
        self, buffers: dict[str, torch.Tensor], static: dict[str, int]
    ) -> tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]:
        """Record one call of the function on `buffers` into a graph of this instance's pool."""
        device = next(iter(buffers.values())).device
        _, capture = self._streams_of(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(capture):
            graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
            try:
                outputs = self.fn(**buffers, **static)
            except BaseException:
                with contextlib.suppress(Exception):  # the capture's own error is the one to see
                    graph.capture_end()
                raise
            graph.capture_end()
        torch.cuda.current_stream(device).wait_stream(capture)
        return graph, tuple(outputs)

    def _release_cache(self, device: torch.device) -> bool:
        """Hand the allocator's cached, unused blocks on `device` back to it; False if none were."""
        if torch.cuda.memory_reserved(device) <= torch.cuda.memory_allocated(device):
            return False
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        return True
