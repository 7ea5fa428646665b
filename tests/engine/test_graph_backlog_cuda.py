"""Graphs of wide batches left for after the start (`graphs_at_start`), on a GPU: every one is captured
after the start (while the stages are idle, or by the first step that needs it), and bursts at those
widths answer alike (GPU only)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch

from omnivoice.config import Profile, parse_profile
from omnivoice.engine.engine import Engine
from tests.support.engine import AUDIO_FRAMES, audio_of, collect, request, tokens_of, wait_idle
from tests.support.polling import until

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")

BURST = 8  # past graphs_at_start: its batch buckets are left for after the start


def _profile(checkpoint: Path) -> Profile:
    stage = {
        "device": "cuda:0",
        "dtype": "bfloat16",
        "max_batch": 16,
        "execution": "cuda_graph",
        "worker": "thread",
        "max_seq_len": 256,
        "graphs_at_start": 2,
    }
    return parse_profile(
        {
            "model": {"path": str(checkpoint)},
            "stages": {
                "thinker": {**stage, "prefix_cache_entries": 0},  # both bursts prefill alike
                "talker": stage,
                "code2wav": {**stage, "chunk": {"first_frames": 4, "frames": 25, "left_context": 25}},
                "capacity": {"enabled": False},
                "warm_burst": False,
            },
        }
    )


def test_wide_graphs_left_for_later_answer_alike_and_are_all_captured(tiny_checkpoint: Path) -> None:
    asyncio.run(_bursts(tiny_checkpoint))  # no async test plugin needed on a GPU machine


def _pending(eng: Engine) -> dict[str, int]:
    return {s.name: s.graphs_pending for s in eng.stats().stages}


async def _bursts(checkpoint: Path) -> None:
    eng = await Engine.start(_profile(checkpoint))
    try:
        answers = []
        for _ in range(2):
            results = await asyncio.gather(*(collect(eng, request(eng, i)) for i in range(BURST)))
            for _, fin in results:
                assert fin.error is None and fin.usage.audio_frames == AUDIO_FRAMES
            answers.append([(tokens_of(outs), audio_of(outs)) for outs, _ in results])
            await wait_idle(eng, 30)
        for (tokens0, audio0), (tokens1, audio1) in zip(*answers, strict=True):
            assert tokens0 == tokens1
            assert audio0.shape == audio1.shape and np.isfinite(audio0).all()
            np.testing.assert_allclose(audio0, audio1, atol=0.02 * float(np.abs(audio1).max()) + 1e-6)
        await until(lambda: not any(_pending(eng).values()), 120, what="every graph captured while idle")
    finally:
        await eng.close()
