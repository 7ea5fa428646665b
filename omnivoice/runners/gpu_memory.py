"""What a GPU has left, for the log lines of a stage's start: a stage that later finds no memory for a
graph or a workspace (a restart on a GPU still held by the stages before it, say) shows there what it
started with and what its own load took."""

from __future__ import annotations

import torch

GIB = float(1 << 30)


def _free_and_total(device: torch.device) -> tuple[int, int] | None:
    """(free, total) bytes of a CUDA device; None for any other device or where the driver cannot say."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    try:
        free, total = torch.cuda.mem_get_info(device)
    except RuntimeError:  # a device fault or no context
        return None
    return int(free), int(total)


def free_bytes(device: torch.device) -> int | None:
    """The bytes free on a CUDA device; None for any other device or where the driver cannot say."""
    info = _free_and_total(device)
    return None if info is None else info[0]


def memory_note(device: torch.device, held: bool = False) -> str:
    """'; cuda:0 has 41.2 of 139.8 GiB free' for a CUDA device (with `held`, also what this process's
    allocator holds there), '' for any other device or where the driver cannot say."""
    info = _free_and_total(device)
    if info is None:
        return ""
    free, total = info
    note = f"; {device} has {free / GIB:.1f} of {total / GIB:.1f} GiB free"
    if held:
        note += f", this process holds {torch.cuda.memory_reserved(device) / GIB:.1f} GiB"
    return note
