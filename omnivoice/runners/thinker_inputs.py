"""The thinker's input embeddings for (part of) a prompt: token embeddings with the audio encoder's
output placed on each audio placeholder run (images: runners/vision_encoder.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from omnivoice.runners.vision_encoder import placeholder_runs
from omnivoice.types import Prompt


def audio_spans(ids: tuple[int, ...], audio_pad_id: int) -> list[tuple[int, int]]:
    """[start, end) of each run of audio placeholders, in order."""
    return placeholder_runs(ids, audio_pad_id)


def check_audio(prompt: Prompt, audio_pad_id: int, n_mels: int, tokens: Callable[[int], int]) -> None:
    """Raise ValueError unless every audio clip is [n_mels, frames > 0] and its placeholder run holds
    as many placeholders as the encoder makes tokens of it (`tokens(frames)`)."""
    spans = audio_spans(prompt.input_ids, audio_pad_id)
    if len(spans) != len(prompt.audio_features):
        raise ValueError(f"{len(spans)} audio placeholder runs but {len(prompt.audio_features)} audio clips")
    for i, ((a, b), mel) in enumerate(zip(spans, prompt.audio_features, strict=True)):
        if mel.ndim != 2 or mel.shape[0] != n_mels or mel.shape[1] == 0:
            raise ValueError(f"audio clip {i}: features must be [{n_mels}, frames], not {tuple(mel.shape)}")
        if b - a != tokens(mel.shape[1]):
            raise ValueError(
                f"audio clip {i} has {b - a} placeholders for {tokens(mel.shape[1])} encoder outputs"
            )


def needed_clips(prompt: Prompt, audio_pad_id: int, start: int) -> list[int]:
    """The prompt's audio clips (indices) with placeholders at or after position `start`: those whose
    encoder output its embeddings from `start` on need (the others are in the prefix cache)."""
    spans = audio_spans(prompt.input_ids, audio_pad_id)
    if len(spans) != len(prompt.audio_features):
        raise ValueError(f"{len(spans)} audio placeholder runs but {len(prompt.audio_features)} audio clips")
    return [i for i, (_, end) in enumerate(spans) if end > start]


def embed_prompt(
    thinker: Any,
    audio_pad_id: int,
    prompt: Prompt,
    start: int,
    device: torch.device,
    audio: Mapping[int, torch.Tensor],
) -> torch.Tensor:
    """Input embeddings of prompt positions start.. : [1, n - start, H].

    `audio` holds the encoder output [tokens, out_dim] of each clip in `needed_clips(prompt, .., start)`.
    """
    ids = torch.tensor([prompt.input_ids[start:]], device=device)
    embeds = thinker.get_input_embeddings()(ids)  # [1, T, H]
    spans = audio_spans(prompt.input_ids, audio_pad_id)
    for i in needed_clips(prompt, audio_pad_id, start):
        a, b = spans[i]
        clip = audio[i]
        if clip.shape[0] != b - a:
            raise ValueError(f"audio clip {i} has {b - a} placeholders but {clip.shape[0]} encoder outputs")
        first = max(a, start)
        embeds[0, first - start : b - start] = clip[first - a :].to(embeds.device, embeds.dtype)
    return embeds
