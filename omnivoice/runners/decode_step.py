"""One-token decode steps of a running batch over a DecoderStack and its slot KV cache.

On a GPU the batch is padded to a batch-size bucket (padding rows write to the cache's scratch slot)
and attention to a KV-length bucket, so every step of a bucket has the same shapes and, with
`execution: cuda_graph`, replays one captured CUDA graph. On the CPU steps run eagerly at their exact
size (padding would only cost time there).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from omnivoice.runners.decoder import DecoderStack
from omnivoice.runners.graph_backlog import GraphBacklog
from omnivoice.runners.graphs import StepGraphs, batch_buckets, bucket, kv_buckets
from omnivoice.runners.kv_cache import SlotKVCache
from omnivoice.runners.transfer import to_device

log = logging.getLogger(__name__)


class DecodeStep:
    def __init__(
        self,
        stack: DecoderStack,
        cache: SlotKVCache,
        max_batch: int,
        device: torch.device,
        graphs: bool,
        name: str,
        keep: tuple[int, ...] = (),
    ) -> None:
        self.stack = stack
        self.cache = cache
        self.device = device
        self.keep = keep
        self.pad = device.type == "cuda"
        self.batch_sizes = batch_buckets(max_batch)
        self.kv_sizes = kv_buckets(cache.max_len)
        self.graphs = StepGraphs(self._fn, f"{name} decode", enabled=graphs)
        self.name = name

    def rows(self, n: int) -> int:
        """How many rows a step of n requests runs (its batch bucket on a GPU)."""
        return bucket(n, self.batch_sizes) if self.pad else n

    def __call__(
        self, inputs: torch.Tensor, slots: list[int], slot_idx: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """inputs [R, 1, H] (R = rows(len(slots)); rows past the slots are padding) -> the final
        hidden [n, H] and the kept layers' hidden states {layer: [n, H]}. Advances the slots by one.
        `slot_idx`: `slot_index(slots)` if the caller has it already."""
        n, rows = len(slots), inputs.shape[0]
        starts = [self.cache.lengths[s] for s in slots]
        end = max(starts) + 1
        if end > self.cache.max_len:
            raise RuntimeError(f"sequence exceeds the KV cache length {self.cache.max_len}")
        kv_len = bucket(end, self.kv_sizes) if self.pad else end
        pad = rows - n
        if slot_idx is None:
            slot_idx = self.slot_index(slots)
        start_idx = to_device(starts + [0] * pad, self.device)
        outs = self._run(rows, kv_len, inputs, slot_idx, start_idx)
        for slot, start in zip(slots, starts, strict=True):
            self.cache.lengths[slot] = start + 1
        return outs[0][:n], {k: o[:n] for k, o in zip(self.keep, outs[1:], strict=True)}

    def slot_index(self, slots: list[int]) -> torch.Tensor:
        """The KV slot of each row of a step of `slots` [rows(len(slots))] on the device: padding rows
        name the scratch slot."""
        return to_device(slots + [self.cache.scratch] * (self.rows(len(slots)) - len(slots)), self.device)

    def capture_all(
        self,
        hidden_size: int,
        dtype: torch.dtype,
        widest: int | None = None,
        backlog: GraphBacklog | None = None,
    ) -> None:
        """Capture the (batch bucket, KV bucket) graphs now, so none is captured while serving; with
        `widest` and `backlog`, only the buckets of up to `widest` rows, the wider ones left in
        `backlog` (narrowest first)."""
        if not self.graphs.enabled:
            return
        began = time.perf_counter()
        now = [r for r in self.batch_sizes if backlog is None or widest is None or r <= widest]
        later = 0
        for rows in self.batch_sizes:
            for kv_len in self.kv_sizes:
                capture = self._capturer(rows, kv_len, hidden_size, dtype)
                if rows in now:
                    capture()
                else:
                    assert backlog is not None
                    backlog.add(self.graphs, (rows, kv_len), capture)
                    later += 1
        log.info(
            "%s: %d CUDA graphs captured in %.1f s (batch %s x KV length %s)%s",
            self.name,
            len(self.graphs.captured),
            time.perf_counter() - began,
            now,
            list(self.kv_sizes),
            f"; {later} of wider batches left for when the stage is idle" if later else "",
        )

    def _capturer(self, rows: int, kv_len: int, hidden_size: int, dtype: torch.dtype) -> Callable[[], object]:
        """A call that captures the (rows, kv_len) graph from padding rows (the scratch slot)."""

        def capture() -> object:
            inputs = torch.zeros(rows, 1, hidden_size, dtype=dtype, device=self.device)
            slot_idx = torch.full((rows,), self.cache.scratch, dtype=torch.long, device=self.device)
            start_idx = torch.zeros(rows, dtype=torch.long, device=self.device)
            with torch.inference_mode():
                return self._run(rows, kv_len, inputs, slot_idx, start_idx)

        return capture

    def _run(self, rows, kv_len, inputs, slot_idx, start_idx) -> tuple[torch.Tensor, ...]:
        tensors = {"inputs": inputs, "slot_idx": slot_idx, "start_idx": start_idx}
        return self.graphs((rows, kv_len), tensors, kv_len=kv_len)

    def _fn(
        self, inputs: torch.Tensor, slot_idx: torch.Tensor, start_idx: torch.Tensor, kv_len: int
    ) -> tuple[torch.Tensor, ...]:
        h, kept = self.stack.forward_indexed(inputs, self.cache, slot_idx, start_idx, kv_len, self.keep)
        return (h[:, -1], *(kept[k][:, -1] for k in self.keep))


def pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """x [n, ...] zero-padded to [rows, ...]."""
    n = x.shape[0]
    if n == rows:
        return x
    return torch.cat([x, x.new_zeros(rows - n, *x.shape[1:])])
