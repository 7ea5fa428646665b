"""A forkserver preload whose forked processes find CUDA unusable, as after a CUDA call in the
forkserver (which a CPU-only torch cannot make): tests/engine/test_process_start.py runs the stages'
context with it in place of engine/forkserver_preload.py."""

from __future__ import annotations

import torch

from omnivoice.engine import forkserver_preload

from .forkserver_probe import POISONED_CALL_SITE

torch.cuda._is_in_bad_fork = lambda: True  # what torch reports in a process forked after a CUDA call
forkserver_preload.CUDA_CALL_SITE = POISONED_CALL_SITE
