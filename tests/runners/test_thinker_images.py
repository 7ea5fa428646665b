"""The thinker on prompts with images: rotary positions as transformers' `get_rope_index` computes
them, the vision tower's features where the model's forward puts them, and greedy tokens equal to
transformers' generate(), fresh and on top of a cached conversation prefix (tiny checkpoint, CPU)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from omnivoice.config import parse_profile
from omnivoice.messages import NewRequest, StageFinished, TokenOutput
from omnivoice.models.loader import load_image_settings, load_processor_parts
from omnivoice.models.prompt import PromptBuilder
from omnivoice.runners.factory import build_runners
from omnivoice.runners.vision_encoder import image_inputs, rope_positions
from omnivoice.types import ChatMessage, GenerationRequest, ImagePart, Prompt, Sampling, TextPart

TOKENS = 6


@pytest.fixture(scope="module")
def setup(tiny_checkpoint: Path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    stage = {"device": "cpu", "worker": "thread", "max_batch": 4, "max_seq_len": 512}
    profile = parse_profile({"model": {"path": str(tiny_checkpoint)}, "stages": {"thinker": stage}})
    thinker = build_runners(profile, tiny_checkpoint, only=(("thinker", 0),))[("thinker", 0)]
    tokenizer, feature_extractor = load_processor_parts(tiny_checkpoint)
    settings = load_image_settings(tiny_checkpoint)
    yield thinker, PromptBuilder(tokenizer, feature_extractor, thinker.spec, image_settings=settings)
    torch.set_num_threads(threads)


def picture(height: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def image_prompt(builder: PromptBuilder, *more: ChatMessage) -> Prompt:
    first = ChatMessage("user", (TextPart("Look:"), ImagePart(picture(64, 96)), TextPart("What is it?")))
    return builder.build([first, *more], default_system="You describe pictures.")


def reference_inputs(prompt: Prompt) -> dict[str, Any]:
    ids = torch.tensor([prompt.input_ids])
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "pixel_values": torch.from_numpy(np.concatenate(prompt.image_patches)),
        "image_grid_thw": torch.tensor(prompt.image_grids),
    }


def run(thinker: Any, request: GenerationRequest) -> list[int]:
    tokens: list[int] = []
    thinker.accept(NewRequest(request))
    finished = []
    while thinker.has_work():
        for out in thinker.step():
            if isinstance(out, TokenOutput):
                tokens += out.token_ids
            elif isinstance(out, StageFinished):
                finished.append(out)
    assert [f.reason for f in finished] == ["length"], finished
    return tokens


def request(prompt: Prompt, rid: str, cache_key: str | None = None) -> GenerationRequest:
    sampling = Sampling(max_tokens=TOKENS, min_tokens=TOKENS)
    return GenerationRequest(rid, prompt, want_audio=False, thinker=sampling, cache_key=cache_key)


def test_rope_positions_equal_transformers(setup) -> None:
    thinker, builder = setup
    prompt = image_prompt(
        builder, ChatMessage("assistant", (TextPart("Noise."),)),
        ChatMessage("user", (ImagePart(picture(40, 200, 1)), TextPart("And this?"))),
    )  # fmt: skip
    inputs = reference_inputs(prompt)
    expected, delta = thinker.model.get_rope_index(
        inputs["input_ids"], inputs["image_grid_thw"], attention_mask=inputs["attention_mask"]
    )
    positions, shift = rope_positions(prompt, thinker.spec.image_pad_id, 2)
    assert np.array_equal(positions, expected[:, 0].long().numpy())
    assert shift == int(delta) < 0


def test_image_features_land_on_the_placeholders(setup) -> None:
    thinker, builder = setup
    prompt = image_prompt(builder)
    model, pad = thinker.model, thinker.spec.image_pad_id
    inputs = reference_inputs(prompt)
    with torch.no_grad():
        embeds = model.get_input_embeddings()(inputs["input_ids"])
        features = model.get_image_features(
            inputs["pixel_values"], inputs["image_grid_thw"], return_dict=True
        )
        expected = embeds.masked_scatter((inputs["input_ids"] == pad)[..., None], features.pooler_output[0])
        images, _ = image_inputs(model, prompt, pad, 2, embeds.clone(), 0)
        ours = embeds.clone()
        image_inputs(model, prompt, pad, 2, ours, 0)
    assert torch.equal(ours, expected)
    mask = inputs["input_ids"][0] == pad
    (deep,) = images.deepstack
    assert torch.equal(deep[mask], features.deepstack_features[0][0]) and not deep[~mask].any()


def test_greedy_tokens_equal_transformers_generate(setup) -> None:
    thinker, builder = setup
    prompt = image_prompt(builder)
    with torch.no_grad():
        out = thinker.model.generate(
            **reference_inputs(prompt), max_new_tokens=TOKENS, min_new_tokens=TOKENS, do_sample=False
        )
    expected = out[0, len(prompt.input_ids) :].tolist()
    assert run(thinker, request(prompt, "image")) == expected


def test_a_cached_image_conversation_continues_as_a_fresh_one(setup) -> None:
    thinker, builder = setup
    first = image_prompt(builder)
    answer = run(thinker, request(first, "turn-1", cache_key="conversation"))
    said = builder._tokenizer.decode(answer, skip_special_tokens=True)
    follow = (ChatMessage("assistant", (TextPart(said),)), ChatMessage("user", (TextPart("Sure?"),)))
    second = image_prompt(builder, *follow)
    cached = run(thinker, request(second, "turn-2", cache_key="conversation"))
    assert thinker.stats().cached_tokens > 0
    assert cached == run(thinker, replace(request(second, "turn-2-fresh")))


def test_a_different_image_of_the_same_size_is_not_served_from_the_cache(setup) -> None:
    thinker, builder = setup
    run(thinker, request(image_prompt(builder), "seen", cache_key="pictures"))
    other = ChatMessage("user", (TextPart("Look:"), ImagePart(picture(64, 96, 7)), TextPart("What is it?")))
    prompt = builder.build([other], default_system="You describe pictures.")
    before = thinker.stats().cached_tokens
    tokens = run(thinker, request(prompt, "unseen", cache_key="pictures"))
    first_image = prompt.input_ids.index(thinker.spec.image_pad_id)
    assert thinker.stats().cached_tokens - before == first_image  # the text before the image only
    assert tokens == run(thinker, request(prompt, "unseen-fresh"))
