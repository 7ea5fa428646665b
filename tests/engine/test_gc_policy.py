"""A started engine exempts its built objects from the cyclic GC, and a stopped one thaws them."""

from __future__ import annotations

import gc
import logging
from pathlib import Path

import pytest

from omnivoice.config import parse_profile
from omnivoice.engine.engine import Engine
from omnivoice.engine.gc_policy import thaw_built_objects, watch_gc_pauses


async def test_thread_stages_freeze_what_they_built_until_the_engine_stops(tiny_checkpoint: Path) -> None:
    stage = {"worker": "thread", "max_seq_len": 256, "max_batch": 2}
    stages = {s: stage for s in ("thinker", "talker", "code2wav")}
    profile = parse_profile({"model": {"path": str(tiny_checkpoint)}, "stages": stages})
    gc.unfreeze()
    engine = await Engine.start(profile)
    try:
        # the model's modules and tensors, and all that torch and transformers hold
        assert gc.get_freeze_count() > 10_000
        assert any(type(cb).__name__ == "_PauseWatch" for cb in gc.callbacks)
    finally:
        await engine.close()
    assert gc.get_freeze_count() == 0
    assert not any(type(cb).__name__ == "_PauseWatch" for cb in gc.callbacks)


def test_a_slow_collection_is_logged(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    watch_gc_pauses()
    watch_gc_pauses()  # installed once
    watches = [cb for cb in gc.callbacks if type(cb).__name__ == "_PauseWatch"]
    assert len(watches) == 1
    monkeypatch.setattr("omnivoice.engine.gc_policy.SLOW_COLLECTION_S", 0.0)
    try:
        with caplog.at_level(logging.WARNING, logger="omnivoice.engine.gc_policy"):
            gc.collect()
    finally:
        thaw_built_objects()
    assert any("gc: generation 2 collection took" in r.getMessage() for r in caplog.records)
