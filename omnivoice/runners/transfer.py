"""Small host -> device copies that do not stall the GPU queue.

`torch.tensor(list, device="cuda")` copies from pageable memory, which synchronizes the stream: the
host waits for every kernel queued so far, so the next launches cannot overlap them. Staging the
values in pinned memory makes the copy asynchronous (the caching host allocator keeps the buffer
alive until the copy has run).
"""

from __future__ import annotations

from collections.abc import Sequence

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
