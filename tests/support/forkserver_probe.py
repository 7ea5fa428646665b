"""What a process started from the stage processes' multiprocessing context finds when it starts
(tests/engine/test_process_start.py): run as that process's target, it reports on a queue."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
from typing import Any

POISONED_CALL_SITE = "torch._C._cuda_getDeviceCount, called from a test's preload"
"""What tests/support/cuda_poisoned_preload.py names as its forkserver's CUDA call."""
PROBED = ("torch", "transformers", "omnivoice.engine.stage_process", "omnivoice.runners.talker")


def probe(out: Any, server: int, variable: str, environ: dict[str, str]) -> None:
    """Report the modules of PROBED already imported, whether CUDA was initialized, this process's
    parent and the process `multiprocessing` says started it, whether `server` is seen running, and
    `variable` in the environment before and after taking `environ` (the stage processes' way)."""
    imported = [m for m in PROBED if m in sys.modules]  # before this function imports anything
    import torch

    from omnivoice.engine.parent_watch import server_alive
    from omnivoice.engine.stage_process import take_environment

    before = os.environ.get(variable)
    take_environment(environ)
    parent = mp.parent_process()
    out.put(
        {
            "imported": imported,
            "cuda_initialized": torch.cuda.is_initialized(),
            "ppid": os.getppid(),
            "started_by": None if parent is None else parent.pid,
            "server_alive": server_alive(server),
            "before": before,
            "after": os.environ.get(variable),
        }
    )
