"""The thinker's input embeddings for (part of) a prompt: token embeddings with the audio encoder's
output placed on each audio placeholder run."""

from __future__ import annotations

from typing import Any

import torch

from omnivoice.models.prompt import audio_inputs
from omnivoice.types import Prompt


def audio_spans(ids: tuple[int, ...], audio_pad_id: int) -> list[tuple[int, int]]:
    """[start, end) of each run of audio placeholders, in order."""
    spans: list[tuple[int, int]] = []
    start = -1
    for i, tok in enumerate((*ids, -1)):
        if tok == audio_pad_id and start < 0:
            start = i
        elif tok != audio_pad_id and start >= 0:
            spans.append((start, i))
            start = -1
    return spans


def embed_prompt(
    thinker: Any, audio_pad_id: int, prompt: Prompt, start: int, device: torch.device
) -> torch.Tensor:
    """Input embeddings of prompt positions start.. : [1, n - start, H].

    Only the audios with placeholders at or after `start` are encoded (the others are cached).
    """
    ids = torch.tensor([prompt.input_ids[start:]], device=device)
    embeds = thinker.get_input_embeddings()(ids)  # [1, T, H]
    spans = audio_spans(prompt.input_ids, audio_pad_id)
    if len(spans) != len(prompt.audio_features):
        raise ValueError(f"{len(spans)} audio placeholder runs but {len(prompt.audio_features)} audio clips")
    needed = [i for i, (_, end) in enumerate(spans) if end > start]
    if not needed:
        return embeds
    inputs = audio_inputs(Prompt((), tuple(prompt.audio_features[i] for i in needed)))
    assert inputs is not None
    batch, mask = inputs  # as the processor pads them: [n, n_mels, frames], [n, frames]
    audio = thinker.get_audio_features(batch.to(device, embeds.dtype), mask.to(device)).last_hidden_state
    audio = audio.to(embeds.dtype)
    lengths = [spans[i][1] - spans[i][0] for i in needed]
    if sum(lengths) != audio.shape[0]:
        raise ValueError(f"{sum(lengths)} audio placeholders but {audio.shape[0]} audio features")
    offset = 0
    for i, n in zip(needed, lengths, strict=True):
        a, b = spans[i]
        first = max(a, start)
        embeds[0, first - start : b - start] = audio[offset + first - a : offset + n]
        offset += n
    return embeds
