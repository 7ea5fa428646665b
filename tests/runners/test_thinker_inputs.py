"""The thinker's input embeddings of a prompt with audio, from the batched encoder's output, equal the
ones transformers' thinker feeds its language model; so do those of the part past a cached prefix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from omnivoice.models.loader import load_model, load_processor_parts
from omnivoice.models.prompt import PromptBuilder, audio_inputs
from omnivoice.runners.audio_encoder import AudioEncoder, audio_tower
from omnivoice.runners.thinker_inputs import embed_prompt, needed_clips
from omnivoice.types import AudioPart, ChatMessage, Prompt, TextPart


@pytest.fixture(scope="module")
def parts(tiny_checkpoint: Path):
    loaded = load_model(tiny_checkpoint)
    tokenizer, extractor = load_processor_parts(tiny_checkpoint)
    return loaded.model.thinker, loaded.spec, PromptBuilder(tokenizer, extractor, loaded.spec)


def noise(seconds: float, seed: int) -> np.ndarray:
    return (0.1 * np.random.default_rng(seed).standard_normal(int(seconds * 16000))).astype(np.float32)


def transformers_embeddings(thinker: Any, prompt: Prompt) -> torch.Tensor:
    """The inputs_embeds transformers' thinker hands its language model for `prompt`: [1, n, H]."""
    seen: dict[str, torch.Tensor] = {}

    def grab(_module: Any, args: tuple, kwargs: dict) -> None:
        seen["embeds"] = kwargs["inputs_embeds"].detach().clone()

    text_model = getattr(thinker.model, "language_model", thinker.model)
    hook = text_model.register_forward_pre_hook(grab, with_kwargs=True)
    features, mask = audio_inputs(prompt)  # type: ignore[misc]
    ids = torch.tensor([prompt.input_ids])
    try:
        with torch.no_grad():
            thinker(input_ids=ids, attention_mask=torch.ones_like(ids), input_features=features,
                    feature_attention_mask=mask)  # fmt: skip
    finally:
        hook.remove()
    return seen["embeds"]


def test_embeddings_of_a_prompt_with_audio_equal_transformers(parts) -> None:
    thinker, spec, builder = parts
    # two clips of whole chunks and more (transformers pads both alike in its batch), and text around
    messages = [
        ChatMessage("system", (TextPart("be brief"),)),
        ChatMessage("user", (AudioPart(noise(1.37, 0), 16000), TextPart("and this:"))),
        ChatMessage("assistant", (TextPart("go on"),)),
        ChatMessage("user", (AudioPart(noise(9.02, 1), 16000),)),
    ]
    prompt = builder.build(messages)
    encoder = AudioEncoder(audio_tower(thinker), torch.device("cpu"), max_windows=4)
    audio = dict(enumerate(encoder.encode_clips(list(prompt.audio_features))))
    ref = transformers_embeddings(thinker, prompt)
    with torch.no_grad():
        ours = embed_prompt(thinker, spec.audio_pad_id, prompt, 0, torch.device("cpu"), audio)
        assert ours.shape == ref.shape
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-7)
        # past a cached prefix that ends inside the second clip: only that clip is needed
        start = prompt.input_ids.index(spec.audio_pad_id, len(prompt.input_ids) - 60)
        assert needed_clips(prompt, spec.audio_pad_id, start) == [1]
        tail = embed_prompt(thinker, spec.audio_pad_id, prompt, start, torch.device("cpu"), {1: audio[1]})
        torch.testing.assert_close(tail, ref[:, start:], rtol=1e-5, atol=1e-7)


def test_an_encoder_output_of_the_wrong_length_is_refused(parts) -> None:
    thinker, spec, builder = parts
    prompt = builder.build([ChatMessage("user", (AudioPart(noise(1.0, 2), 16000),))])
    with pytest.raises(ValueError, match="placeholders but"):
        embed_prompt(thinker, spec.audio_pad_id, prompt, 0, torch.device("cpu"), {0: torch.zeros(3, 64)})
