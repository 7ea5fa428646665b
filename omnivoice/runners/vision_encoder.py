"""The thinker's vision tower on a prompt's images, and the rotary positions of an image prompt.

Each image's placeholder run gets the vision tower's merged features; the tower's deepstack features
(one set per tapped vision layer) are added to the outputs of the thinker's first layers on the same
positions. Rotary positions follow Qwen3-Omni's multimodal RoPE: text and audio count up one per token
on all three axes; an image's placeholders share the temporal position where the run starts and count
rows and columns of merged patches on the other two, and the text after it resumes one past the
largest of them, so an image takes fewer rotary positions than it has placeholders.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from omnivoice.types import Prompt


@dataclass
class ImageInputs:
    """What a prompt's images add to positions start.. of its prefill."""

    deepstack: list[torch.Tensor]  # per tapped vision layer: [T, H], zero off the image placeholders
    rope: torch.Tensor  # [3, T] rotary positions


def placeholder_runs(ids: tuple[int, ...], pad_id: int) -> list[tuple[int, int]]:
    """[start, end) of each run of `pad_id`, in order."""
    runs: list[tuple[int, int]] = []
    start = -1
    for i, tok in enumerate((*ids, -1)):
        if tok == pad_id and start < 0:
            start = i
        elif tok != pad_id and start >= 0:
            runs.append((start, i))
            start = -1
    return runs


def rope_positions(prompt: Prompt, image_pad_id: int, merge_size: int) -> tuple[np.ndarray, int]:
    """The prompt's rotary positions [3, n] and the shift of what follows it: the position after its
    last one minus n (0 without images, negative with)."""
    n = len(prompt.input_ids)
    runs = placeholder_runs(prompt.input_ids, image_pad_id)
    if len(runs) != len(prompt.image_grids):
        raise ValueError(f"{len(runs)} image placeholder runs but {len(prompt.image_grids)} images")
    out = np.zeros((3, n), dtype=np.int64)
    done, next_pos = 0, 0  # prompt positions placed so far, and the rotary position after them
    for (a, b), (t, gh, gw) in zip(runs, prompt.image_grids, strict=True):
        h, w = gh // merge_size, gw // merge_size
        if t != 1 or h * w != b - a:
            raise ValueError(f"an image run of {b - a} placeholders does not fit its grid {(t, gh, gw)}")
        out[:, done:a] = next_pos + np.arange(a - done)
        start = next_pos + a - done
        out[0, a:b] = start
        out[1, a:b] = start + np.repeat(np.arange(h), w)
        out[2, a:b] = start + np.tile(np.arange(w), h)
        done, next_pos = b, start + max(h, w)
    out[:, done:] = next_pos + np.arange(n - done)
    return out, next_pos + n - done - n


def encode_images(thinker: Any, prompt: Prompt, which: list[int], device: torch.device) -> list[Any]:
    """The vision tower's output for the images `which` of `prompt`: per image, its merged features
    [placeholders, H] and its deepstack features (a list of [placeholders, H])."""
    pixels = np.concatenate([prompt.image_patches[i] for i in which])
    grids = torch.tensor([prompt.image_grids[i] for i in which], dtype=torch.long, device=device)
    out = thinker.get_image_features(torch.from_numpy(pixels).to(device), grids, return_dict=True)
    return [(out.pooler_output[k], [d[k] for d in out.deepstack_features]) for k in range(len(which))]


def image_inputs(
    thinker: Any, prompt: Prompt, image_pad_id: int, merge_size: int, embeds: torch.Tensor, start: int
) -> tuple[ImageInputs, int]:
    """Place the features of the images with placeholders at or after `start` on `embeds` [1, T, H]
    (the prompt's positions start..) in place; return the deepstack inputs and rotary positions of
    those positions, and the prompt's rotary shift."""
    rope, delta = rope_positions(prompt, image_pad_id, merge_size)
    runs = placeholder_runs(prompt.input_ids, image_pad_id)
    needed = [i for i, (_, end) in enumerate(runs) if end > start]
    t, hidden = embeds.shape[1], embeds.shape[2]
    layers = len(thinker.config.vision_config.deepstack_visual_indexes)
    deepstack = [embeds.new_zeros(t, hidden) for _ in range(layers)]
    if needed:
        encoded = encode_images(thinker, prompt, needed, embeds.device)
        for i, (features, stack) in zip(needed, encoded, strict=True):
            a, b = runs[i]
            first = max(a, start)
            embeds[0, first - start : b - start] = features[first - a :].to(embeds.dtype)
            for layer, feats in zip(deepstack, stack, strict=True):
                layer[first - start : b - start] = feats[first - a :].to(embeds.dtype)
    rope_t = torch.from_numpy(rope[:, start:]).to(embeds.device)
    return ImageInputs(deepstack, rope_t), delta
