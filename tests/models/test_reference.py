"""The reference the engine's parity tests hold it to (tests/support/reference.py): transformers' own
greedy generate() on the tiny checkpoint, its codec frames captured as generate() decodes them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from omnivoice.models.loader import load_model, load_processor_parts
from omnivoice.models.prompt import PromptBuilder
from omnivoice.types import AudioPart, ChatMessage, TextPart
from tests.support.reference import reference_generate


@pytest.fixture(scope="module")
def setup(tiny_checkpoint: Path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    loaded = load_model(tiny_checkpoint)
    tokenizer, feature_extractor = load_processor_parts(tiny_checkpoint)
    builder = PromptBuilder(tokenizer, feature_extractor, loaded.spec)
    pcm = (0.1 * np.random.default_rng(0).standard_normal(36000)).astype(np.float32)
    prompt = builder.build(
        [ChatMessage("user", (AudioPart(pcm, 24000), TextPart("What did I just say?")))],
        default_system="You are a helpful voice assistant.",
    )
    yield loaded, builder, prompt
    torch.set_num_threads(threads)


def test_generate_runs_end_to_end_and_yields_audio(setup) -> None:
    loaded, _, prompt = setup
    spec = loaded.spec
    text_ids, codes, wav = reference_generate(loaded.model, spec, prompt, "ethan", 8, 20)
    assert len(text_ids) == 8 and all(0 <= t < spec.thinker_vocab_size for t in text_ids)
    assert codes.shape == (spec.num_code_groups, 19) and codes.dtype == torch.long  # 20 talker steps
    assert int(codes.min()) >= 0 and int(codes.max()) < spec.codebook_size
    assert wav.dtype == np.float32 and wav.shape == (19 * spec.samples_per_frame - 555,)
    assert 0.05 < float(np.abs(wav).max()) <= 1.0
    # The captured codes are exactly what generate() decoded.
    with torch.no_grad():
        decoded = loaded.model.code2wav.chunked_decode(codes[None], chunk_size=300, left_context_size=25)
    assert np.array_equal(decoded.reshape(-1).numpy(), wav)


def test_greedy_reference_is_reproducible(setup) -> None:
    loaded, _, prompt = setup
    first = reference_generate(loaded.model, loaded.spec, prompt, "ethan", 6, 9)
    second = reference_generate(loaded.model, loaded.spec, prompt, "ethan", 6, 9)
    assert first[0] == second[0] and torch.equal(first[1], second[1]) and np.array_equal(first[2], second[2])


@pytest.mark.parametrize("talker_tokens", [2, 5, 12])
def test_talker_min_new_tokens_fixes_the_frame_count(setup, talker_tokens: int) -> None:
    loaded, builder, _ = setup
    prompt = builder.build([ChatMessage("user", (TextPart("Hello there"),))])
    text_ids, codes, wav = reference_generate(loaded.model, loaded.spec, prompt, "aiden", 3, talker_tokens)
    assert len(text_ids) == 3
    assert codes.shape[1] == talker_tokens - 1
    assert wav.size == max(0, (talker_tokens - 1) * loaded.spec.samples_per_frame - 555)


def test_voice_selects_the_speaker(setup) -> None:
    loaded, _, prompt = setup
    ethan = reference_generate(loaded.model, loaded.spec, prompt, "Ethan", 4, 6)[1]
    chelsie = reference_generate(loaded.model, loaded.spec, prompt, "chelsie", 4, 6)[1]
    assert not torch.equal(ethan, chelsie)
    with pytest.raises(ValueError, match="unknown voice"):
        reference_generate(loaded.model, loaded.spec, prompt, "nobody", 4, 6)
