"""The staged engine on a prompt with an image against transformers' own generate(), on the tiny
checkpoint: the thinker's text and the talker's audio (its prompt's rotary positions are 3D too)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from omnivoice.engine.engine import Engine
from omnivoice.models.loader import load_model
from omnivoice.types import ChatMessage, ImagePart, TextPart
from tests.support.engine import (
    AUDIO_FRAMES,
    THINKER_TOKENS,
    audio_of,
    collect,
    profile_for,
    request,
    started,
    tokens_of,
)
from tests.support.reference import reference_generate


@pytest.fixture
async def engine(tiny_checkpoint: Path):
    async with started(profile_for(tiny_checkpoint)) as eng:
        yield eng


async def test_an_image_prompt_matches_transformers_generate(engine: Engine, tiny_checkpoint: Path) -> None:
    pixels = np.random.default_rng(0).integers(0, 256, (64, 96, 3), dtype=np.uint8)
    question = ChatMessage("user", (ImagePart(pixels), TextPart("What is in the picture?")))
    prompt = engine.build_prompt([question])
    req = replace(request(engine, 0), prompt=prompt)
    outs, fin = await collect(engine, req)
    torch.set_num_threads(1)
    reference = load_model(tiny_checkpoint)
    ref_ids, ref_codes, ref_wav = reference_generate(
        reference.model, reference.spec, prompt, "ethan", THINKER_TOKENS, AUDIO_FRAMES + 1
    )
    assert tokens_of(outs) == ref_ids
    assert fin.usage.audio_frames == ref_codes.shape[1] == AUDIO_FRAMES
    wav = audio_of(outs)
    assert wav.shape == ref_wav.shape
    assert np.abs(wav - ref_wav).max() <= 0.02 * np.abs(ref_wav).max()
