"""Prompts with images: `PromptBuilder` equals Qwen3-Omni's chat template with each image placeholder
expanded as the processor expands it, and its patches equal the processor's slow (PIL) image processor,
on the tiny checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from omnivoice.models.image_processor import ImageSettings
from omnivoice.models.loader import ModelSpec, load_image_settings, load_processor_parts
from omnivoice.models.prompt import PromptBuilder, PromptError
from omnivoice.types import AudioPart, ChatMessage, ImagePart, TextPart


@pytest.fixture(scope="module")
def builder(tiny_checkpoint: Path) -> PromptBuilder:
    tokenizer, feature_extractor = load_processor_parts(tiny_checkpoint)
    spec = ModelSpec.from_pretrained(tiny_checkpoint)
    return PromptBuilder(
        tokenizer, feature_extractor, spec, image_settings=load_image_settings(tiny_checkpoint)
    )


def picture(height: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def reference_processor(s: ImageSettings) -> Qwen2VLImageProcessorPil:
    return Qwen2VLImageProcessorPil(
        patch_size=s.patch_size, merge_size=s.merge_size, temporal_patch_size=s.temporal_patch_size,
        min_pixels=s.min_pixels, max_pixels=s.max_pixels, image_mean=list(s.mean), image_std=list(s.std),
    )  # fmt: skip


def template_ids(builder: PromptBuilder, messages: list[ChatMessage]) -> tuple[list[int], Any]:
    """The template's rendering, each image's one placeholder expanded to the processor's count, and the
    processor's pixel values and grids."""
    tokenizer, settings = builder._tokenizer, builder._image_settings
    assert settings is not None
    chat = []
    for m in messages:
        content = [
            {"type": "text", "text": p.text} if isinstance(p, TextPart)
            else {"type": "image", "image": "x.png"} if isinstance(p, ImagePart)
            else {"type": "audio", "audio": "x.wav"}
            for p in m.parts
        ]  # fmt: skip
        chat.append({"role": m.role, "content": content if m.role == "user" else content[0]["text"]})
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    images = [Image.fromarray(p.rgb) for m in messages for p in m.parts if isinstance(p, ImagePart)]
    out = reference_processor(settings)(images, return_tensors="np")
    counts = [int(g.prod()) // settings.merge_size**2 for g in out["image_grid_thw"]]
    pieces = text.split(tokenizer.image_token)
    expanded = pieces[0] + "".join(
        tokenizer.image_token * n + rest for n, rest in zip(counts, pieces[1:], strict=True)
    )
    return tokenizer.encode(expanded, add_special_tokens=False), out


def test_the_tiny_checkpoint_patches_fit_its_vision_tower(builder: PromptBuilder) -> None:
    s = builder._image_settings
    assert s is not None and (s.patch_size, s.merge_size, s.temporal_patch_size) == (16, 2, 2)


def test_image_turns_equal_the_template_and_processor(builder: PromptBuilder) -> None:
    messages = [
        ChatMessage("system", (TextPart("You describe pictures."),)),
        ChatMessage("user", (ImagePart(picture(50, 70)), TextPart("What is this?"))),
        ChatMessage("assistant", (TextPart("Noise."),)),
        ChatMessage(
            "user",
            (TextPart("And these two?"), ImagePart(picture(33, 400, 1)), ImagePart(picture(200, 90, 2))),
        ),
    ]
    prompt = builder.build(messages)
    ids, out = template_ids(builder, messages)
    assert list(prompt.input_ids) == ids
    assert [list(g) for g in prompt.image_grids] == out["image_grid_thw"].tolist()
    np.testing.assert_array_equal(np.concatenate(prompt.image_patches), out["pixel_values"])


def test_an_image_beside_audio_keeps_both_in_order(builder: PromptBuilder) -> None:
    audio = (0.1 * np.random.default_rng(0).standard_normal(16000)).astype(np.float32)
    messages = [ChatMessage("user", (AudioPart(audio, 16000), ImagePart(picture(64, 64)), TextPart("hi")))]
    prompt = builder.build(messages)
    spec = builder._spec
    ids = list(prompt.input_ids)
    assert ids.index(spec.audio_end_id) < ids.index(spec.vision_start_id)
    assert len(prompt.audio_features) == 1 and prompt.image_grids == ((1, 4, 4),)
    assert ids.count(spec.image_pad_id) == 4


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (
            ChatMessage("assistant", (ImagePart(picture(32, 32)),)),
            "images are only accepted in user messages",
        ),
        (ChatMessage("user", (ImagePart(picture(2, 500)),)), "aspect ratio"),
        (ChatMessage("user", (ImagePart(np.zeros((8, 8), np.uint8)),)), "RGB"),
    ],
)
def test_bad_images_are_prompt_errors(builder: PromptBuilder, message: ChatMessage, error: str) -> None:
    with pytest.raises(PromptError, match=error):
        builder.build([message])


def test_a_builder_without_image_settings_refuses_images(tiny_checkpoint: Path) -> None:
    tokenizer, feature_extractor = load_processor_parts(tiny_checkpoint)
    plain = PromptBuilder(tokenizer, feature_extractor, ModelSpec.from_pretrained(tiny_checkpoint))
    with pytest.raises(PromptError, match="takes no images"):
        plain.build([ChatMessage("user", (ImagePart(picture(32, 32)),))])
