"""Where the engine core's process begins (`multiprocessing` spawn target): a module that imports
neither torch nor transformers, so that the stages' forkserver is started before this process imports
anything heavy. The forkserver's own imports (torch, transformers, the runners) then run beside this
process's imports and its loading of the model's tokenizer, and the stage processes the engine starts
later are forked from it at once (engine/process_start.py)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omnivoice.config import Profile
from omnivoice.engine.process_start import start_forkserver

if TYPE_CHECKING:
    from omnivoice.models.dummy_source import DummySource


def core_process_main(
    profile: Profile,
    source: Path | DummySource,
    inbox: Any,
    outbox: Any,
    parent: int,
    door: socket.socket | None = None,
) -> None:
    """Entry point of the core process; never returns (engine/core/process.py's `run_core`)."""
    start_forkserver(profile.stages)
    from omnivoice.engine.core.process import run_core

    run_core(profile, source, inbox, outbox, parent, door)
