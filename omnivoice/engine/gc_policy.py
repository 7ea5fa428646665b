"""The cyclic garbage collector in a process that holds a model.

A built stage holds millions of long-lived Python objects (modules, parameters, torch.compile's
graphs, guards and generated code). Each full collection of the cyclic GC walks all of them, a pause
that stalls every stage thread of the server at once (BENCHMARKS.md has the figures). Once the model
is built, `freeze_built_objects` moves everything alive to the GC's permanent generation, which
collections skip; objects made later (requests, sessions) are collected as before, and a stopped
engine thaws them again. `watch_gc_pauses` logs any collection that still takes long.
"""

from __future__ import annotations

import gc
import logging
import sys
import time
from typing import Any

log = logging.getLogger(__name__)

SLOW_COLLECTION_S = 0.05


def freeze_built_objects(what: str) -> None:
    """Collect once, then exempt every object alive now from later collections."""
    began = time.perf_counter()
    gc.collect()
    gc.freeze()
    log.info(
        "%s: %d objects built at start frozen out of the cyclic GC (%.2f s)",
        what,
        gc.get_freeze_count(),
        time.perf_counter() - began,
    )
    watch_gc_pauses()


def thaw_built_objects() -> None:
    """Undo `freeze_built_objects` (an engine stopped in a process that goes on)."""
    gc.unfreeze()
    gc.callbacks[:] = [cb for cb in gc.callbacks if not isinstance(cb, _PauseWatch)]


class _PauseWatch:
    """A gc callback timing each collection; collections slower than SLOW_COLLECTION_S are logged."""

    def __init__(self) -> None:
        self.started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
            return
        took = time.perf_counter() - self.started
        if took >= SLOW_COLLECTION_S and not sys.is_finalizing():
            log.warning(
                "gc: generation %d collection took %.0f ms (%d objects collected)",
                info.get("generation", -1),
                took * 1e3,
                info.get("collected", 0),
            )


def watch_gc_pauses() -> None:
    """Log slow collections in this process (installed once)."""
    if not any(isinstance(cb, _PauseWatch) for cb in gc.callbacks):
        gc.callbacks.append(_PauseWatch())
