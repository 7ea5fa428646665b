"""What the forkserver of the stage processes imports before it forks any (engine/process_start.py).

Imported by that forkserver alone, as its preload: a forkserver does nothing but import its preload
modules, then fork a child per request, so the work it must do before it forks is done here, when this
module is imported. Each stage process forked from it starts with what a stage needs already imported:
torch, transformers, the stage process's own code and every runner's.

Nothing here may touch the device: once a process has asked CUDA anything (a device count included:
`torch.cuda.is_available()` does), torch marks every process forked from it as unable to use CUDA
("Cannot re-initialize CUDA in forked subprocess"). Libraries do ask while they are imported:
torch.compile used as a decorator (llguidance's bitmask kernel) imports inductor, whose benchmarking
module calls `torch.cuda.is_available()`. So the imports run with torch's NVML-based availability
check (`PYTORCH_NVML_BASED_CUDA_CHECK=1`), which counts devices through NVML without touching CUDA,
and falls back to CUDA where NVML is missing. And while it imports, this module watches torch's
two entry points into CUDA (`_cuda_getDeviceCount`, `_cuda_init`) and keeps where the first call came
from (`CUDA_CALL_SITE`); `process_start.forkserver_cuda_check` forks a probe that reports it, and the
stages are spawned instead when an imported library made such a call. Nor does this module start a
thread (a lock held by another thread at the fork stays held in the child for ever).

The forkserver ignores SIGTERM, as the stage processes do (engine/stage_process.py): systemd's stop
signals every process of the service, and a forkserver that died of it would leave the server unable
to learn whether its stage processes still run (it hears of their exits through the forkserver) in the
middle of the drain that the signal began. It still ends with the server: it exits once the server and
every process forked from it are gone (multiprocessing's "alive" pipe).
"""

from __future__ import annotations

import os
import signal
import traceback
from collections.abc import Callable
from typing import Any

import torch

CUDA_ENTRY_POINTS = ("_cuda_getDeviceCount", "_cuda_init")
NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"


def _watch_cuda_calls(calls: list[str]) -> Callable[[], None]:
    """Wrap torch's CUDA entry points so that each call appends its Python stack to `calls`; returns
    what puts the originals back."""
    originals = {n: getattr(torch._C, n) for n in CUDA_ENTRY_POINTS if hasattr(torch._C, n)}

    def watched(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls.append(f"torch._C.{name}, called from\n" + "".join(traceback.format_stack(limit=14)[:-1]))
            return original(*args, **kwargs)

        return call

    for name, original in originals.items():
        setattr(torch._C, name, watched(name, original))

    def restore() -> None:
        for name, original in originals.items():
            setattr(torch._C, name, original)

    return restore


def _import_stage_code() -> str | None:
    """Import what a stage process needs; returns where the first CUDA call made meanwhile came from."""
    calls: list[str] = []
    restore = _watch_cuda_calls(calls)
    nvml_check = os.environ.get(NVML_CHECK)
    os.environ[NVML_CHECK] = "1"  # the stage processes take the server's environment, not this one
    try:
        import transformers  # noqa: F401

        from omnivoice.engine import stage_process  # noqa: F401
        from omnivoice.runners import code2wav, factory, talker, thinker  # noqa: F401
    finally:
        restore()
        if nvml_check is None:
            del os.environ[NVML_CHECK]
        else:
            os.environ[NVML_CHECK] = nvml_check
    return calls[0] if calls else None


CUDA_CALL_SITE = _import_stage_code()
"""Where the first CUDA call made while the preload imported came from (None: no call was made)."""

signal.signal(signal.SIGTERM, signal.SIG_IGN)
