"""Every stage at its widest batch bucket on a GPU, with graphs replayed side by side (GPU only)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch

from omnivoice.config import Profile, parse_profile
from omnivoice.engine.engine import Engine
from tests.support.engine import AUDIO_FRAMES, THINKER_TOKENS, audio_of, collect, request, tokens_of

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")

WIDEST = 128


def _profile(checkpoint: Path) -> Profile:
    stage = {
        "device": "cuda:0",
        "dtype": "bfloat16",
        "max_batch": WIDEST,
        "execution": "cuda_graph",
        "worker": "thread",
        "max_seq_len": 256,
        "max_queue": 2 * WIDEST,
    }
    return parse_profile(
        {
            "model": {"path": str(checkpoint)},
            "stages": {
                "thinker": {**stage, "max_prefill_tokens": 8192},
                "talker": stage,
                "code2wav": {**stage, "chunk": {"first_frames": 4, "frames": 25, "left_context": 25}},
                "capacity": {"enabled": False},
            },
        }
    )


def test_a_burst_as_wide_as_every_stage_finishes_whole(tiny_checkpoint: Path) -> None:
    asyncio.run(_two_bursts(tiny_checkpoint))  # no async test plugin needed on a GPU machine


async def _two_bursts(checkpoint: Path) -> None:
    eng = await Engine.start(_profile(checkpoint))
    try:
        for _ in range(2):  # two bursts: the second meets the stages warm, at the widest bucket again
            reqs = [request(eng, i % 3) for i in range(WIDEST)]  # one in three also speaks
            results = await asyncio.gather(*(collect(eng, r) for r in reqs))
            for outs, fin in results:
                assert fin.error is None
                assert len(tokens_of(outs)) == THINKER_TOKENS
                assert fin.usage.audio_frames == AUDIO_FRAMES
                wav = audio_of(outs)
                assert wav.size > 0 and np.isfinite(wav).all()
    finally:
        await eng.close()
