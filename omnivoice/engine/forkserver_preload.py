"""What the forkserver of the stage processes imports before it forks any (engine/process_start.py).

Imported by that forkserver alone, as its preload: a forkserver does nothing but import its preload
modules, then fork a child per request, so the work it must do before it forks is done here, when this
module is imported. Each stage process forked from it starts with what a stage needs already imported:
torch, transformers, the stage process's own code and every runner's.

Nothing here touches the device: a CUDA context made before a fork is unusable in the children, so
this module imports code and calls no `torch.cuda` function; nor does it start a thread (a lock held
by another thread at the fork stays held in the child for ever).

The forkserver ignores SIGTERM, as the stage processes do (engine/stage_process.py): systemd's stop
signals every process of the service, and a forkserver that died of it would leave the server unable
to learn whether its stage processes still run (it hears of their exits through the forkserver) in the
middle of the drain that the signal began. It still ends with the server: it exits once the server and
every process forked from it are gone (multiprocessing's "alive" pipe).
"""

from __future__ import annotations

import signal

import torch  # noqa: F401
import transformers  # noqa: F401

from omnivoice.engine import stage_process  # noqa: F401
from omnivoice.runners import code2wav, factory, talker, thinker  # noqa: F401

signal.signal(signal.SIGTERM, signal.SIG_IGN)
