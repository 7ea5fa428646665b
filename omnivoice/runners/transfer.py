"""Copies between host and device that do not stall the GPU queue.

`torch.tensor(list, device="cuda")` copies from pageable memory, which synchronizes the stream: the
host waits for every kernel queued so far, so the next launches cannot overlap them. Staging the
values in pinned memory makes the copy asynchronous (the caching host allocator keeps the buffer
alive until the copy has run). The other way, `ReadBack` queues a step's results for the host and
hands them over later, once the copies have run.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any, Generic, TypeVar

import torch


def to_device(
    values: Sequence | torch.Tensor, device: torch.device | str, dtype: torch.dtype = torch.long
) -> torch.Tensor:
    """`values` (a list or a CPU tensor) as a tensor of `dtype` on `device`, copied without a stream
    sync on CUDA."""
    host = values.to(dtype) if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    device = torch.device(device)
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host if device.type == "cpu" else host.to(device)


T = TypeVar("T")


def to_host(t: torch.Tensor) -> torch.Tensor:
    """t on the host (floating point as float32), copied without a sync (into pinned memory) from a
    GPU: read it only once the stream has passed the copy."""
    dtype = torch.float32 if t.is_floating_point() else t.dtype
    t = t.detach().to(dtype)
    if t.device.type != "cuda":
        return t
    host = torch.empty(t.shape, dtype=dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host


class ReadBack(Generic[T]):
    """Queued steps whose results the host reads later: `put` starts the copies of a step's tensors
    (any nesting of tuples and lists, None allowed) and keeps them with the step's host-side record;
    `take` hands the oldest steps over once their copies are done."""

    def __init__(self) -> None:
        self._steps: deque[tuple[T, Any, torch.cuda.Event | None]] = deque()

    def __len__(self) -> int:
        return len(self._steps)

    def put(self, record: T, tensors: Any) -> None:
        host = _tree_map(to_host, tensors)
        done = None
        if any(t.device.type == "cuda" for t in _leaves(tensors)):
            done = torch.cuda.Event()
            done.record()
        self._steps.append((record, host, done))

    def take(self, keep: int = 0) -> Iterator[tuple[T, Any]]:
        """Every step but the newest `keep`, oldest first, each once its tensors are on the host."""
        while len(self._steps) > keep:
            record, host, done = self._steps.popleft()
            if done is not None:
                done.synchronize()
            yield record, host


def _tree_map(fn: Any, x: Any) -> Any:
    if isinstance(x, tuple | list):
        return type(x)(_tree_map(fn, v) for v in x)
    return None if x is None else fn(x)


def _leaves(x: Any) -> Iterator[torch.Tensor]:
    if isinstance(x, tuple | list):
        for v in x:
            yield from _leaves(v)
    elif x is not None:
        yield x
