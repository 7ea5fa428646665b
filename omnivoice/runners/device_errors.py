"""Which errors come from the device rather than from a request or the compiler: a failed allocation
(the context stays usable) and a device fault (the context is poisoned). `engine.device_fault` says
what a stage does about each; the runners tell them from a compile failure (`fused_layers`)."""

from __future__ import annotations

# what torch and the CUDA libraries say when the device (not the request) is at fault
_MARKERS = (
    "CUDA error",
    "CUBLAS_STATUS",
    "CUDNN_STATUS",
    "cuDNN error",
    "device-side assert",
    "illegal instruction",
    "illegal memory access",
    "unspecified launch failure",
    "misaligned address",
)
# what the CUDA libraries say when an allocation failed: not sticky, so the device context stays usable
# (torch's own allocator raises torch.OutOfMemoryError)
_OUT_OF_MEMORY_MARKERS = (
    "CUDA error: out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
)


def is_out_of_memory(error: BaseException) -> bool:
    """True when `error` is a failed GPU allocation: the step's requests fail, the stage goes on."""
    if type(error).__name__ == "OutOfMemoryError":  # torch.OutOfMemoryError, without importing torch
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(marker in text for marker in _OUT_OF_MEMORY_MARKERS)


def is_device_fault(error: BaseException) -> bool:
    """True when `error` came from the device rather than from the request (bad input raises others)
    and left its context unusable (a failed allocation does not)."""
    if is_out_of_memory(error):
        return False
    if type(error).__name__ == "AcceleratorError":  # torch's type for CUDA errors (torch >= 2.8)
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(marker in text for marker in _MARKERS)
