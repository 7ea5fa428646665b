"""The talker's input embeddings: its prompt for a request, and the trailing text of each step.

The prompt is the request's user turns (text through the talker's `text_projection`, audio through its
`hidden_projection`; system turns are left out), then the assistant's start: its role tokens, tts_pad
and tts_bos around the first assistant token, each summed with the codec's think / voice / bos ids.
After that each step adds the next projected assistant token (then tts_eos, then tts_pad) to the
previous frame's codes, as transformers' generate() does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from omnivoice.messages import ThinkerChunk
from omnivoice.runners.transfer import to_device
from omnivoice.runners.vision_encoder import rope_positions
from omnivoice.types import TALKER_PROMPT_EXTRA, Prompt

if TYPE_CHECKING:
    from omnivoice.models.loader import ModelSpec


class TalkerInputs:
    """Builds the talker's inputs from the thinker's embeddings and hidden states, on `device`."""

    def __init__(self, talker: Any, tts_embeds: torch.Tensor, spec: ModelSpec, device: torch.device) -> None:
        self.model = talker
        self.spec = spec
        self.device = device
        self.dtype = talker.dtype
        self.codec_embed = talker.get_input_embeddings()
        # [3, Ht]: text_projection of the thinker's tts_bos / tts_eos / tts_pad embeddings
        self.tts_bos, self.tts_eos, self.tts_pad = talker.text_projection(tts_embeds.to(device, self.dtype))

    @property
    def hidden_size(self) -> int:
        return int(self.tts_pad.shape[-1])

    def user_part(self, msg: ThinkerChunk) -> tuple[torch.Tensor, torch.Tensor]:
        """The request's projected user turns [U, Ht], and the thinker embeddings of its last three
        prompt positions ("<|im_start|>assistant\\n") [3, Hth], from its first thinker chunk."""
        # positions are chosen on the host (the ids are host data), so starting a request never waits
        # for the GPU
        ids = torch.as_tensor(msg.prompt_ids, dtype=torch.long)
        user = user_positions(ids, self.spec)
        mm = user & multimodal_positions(ids, self.spec)
        audio_rows = (user & mm).nonzero()[:, 0]
        text_rows = (user & ~mm).nonzero()[:, 0]
        in_user = torch.cumsum(user.long(), 0) - 1  # each user position's row in the user part
        part = torch.empty(int(user.sum()), self.hidden_size, device=self.device, dtype=self.dtype)
        if len(audio_rows):
            hidden = self._rows(msg.prompt_hidden, audio_rows)
            part[to_device(in_user[audio_rows], self.device)] = self.model.hidden_projection(hidden)
        if len(text_rows):
            embeds = self._rows(msg.prompt_embeds, text_rows)
            part[to_device(in_user[text_rows], self.device)] = self.model.text_projection(embeds)
        role = self._rows(msg.prompt_embeds, torch.arange(len(ids) - 3, len(ids)))
        return part, role

    def rope(
        self, prompt_ids: tuple[int, ...], grids: tuple[tuple[int, int, int], ...]
    ) -> tuple[torch.Tensor, int]:
        """The rotary positions of the talker's prompt for a thinker prompt with images (at least its P
        positions: [3, >= P]), and the shift of what follows it: its user turns hold every image (only
        users send them), the assistant start after them is text, so the shift is the same for any
        number of positions after the last image."""
        assert self.spec.image_pad_id is not None
        ids = torch.as_tensor(prompt_ids, dtype=torch.long)
        user_ids = tuple(ids[user_positions(ids, self.spec)].tolist())
        talker_ids = user_ids + (self.spec.tts_pad_id,) * TALKER_PROMPT_EXTRA
        merge = self.model.config.spatial_merge_size
        positions, delta = rope_positions(
            Prompt(talker_ids, image_grids=grids), self.spec.image_pad_id, merge
        )
        return torch.from_numpy(positions), delta

    def prompt(
        self, user_part: torch.Tensor, role_embeds: torch.Tensor, first_text: torch.Tensor, voice: str
    ) -> torch.Tensor:
        """The talker's prompt: the user turns, then the assistant start. [U + TALKER_PROMPT_EXTRA, Ht]"""
        spec = self.spec
        assistant = self.model.text_projection(torch.stack([*role_embeds, first_text]))  # [4, Ht]
        text_part = torch.cat([assistant[:3], self.tts_pad.expand(4, -1), self.tts_bos[None], assistant[3:4]])
        codec_ids = [
            spec.codec_nothink_id,
            spec.codec_think_bos_id,
            spec.codec_think_eos_id,
            spec.speaker_id(voice),
            spec.codec_pad_id,
            spec.codec_bos_id,
        ]
        codec_part = torch.cat(
            [
                torch.zeros(3, text_part.shape[-1], device=self.device, dtype=self.dtype),
                self.codec_embed(to_device(codec_ids, self.device)),
            ]
        )
        return torch.cat([user_part, text_part + codec_part])  # TALKER_PROMPT_EXTRA rows after the user's

    def trailing(self, rows: Sequence[tuple[Sequence[np.ndarray], int]]) -> torch.Tensor:
        """[B, Ht]: for each (forwarded text embeddings, step) row, its next trailing text embedding
        (the projected text, then tts_eos, then tts_pad). The text embeddings are host rows [Hth];
        those a step needs go to the device together, in one copy, and through one projection."""
        texts: list[np.ndarray] = []
        pick: list[int] = []  # each row's place in [projected texts..., tts_eos, tts_pad]
        for text, step in rows:
            j = step + 1  # trailing_text_hidden[step] is the projection of forwarded token step + 1
            if j < len(text):
                pick.append(len(texts))
                texts.append(text[j])
            else:
                pick.append(-2 if j == len(text) else -1)
        ends = torch.stack([self.tts_eos, self.tts_pad])  # [2, Ht]
        if texts:
            ends = torch.cat([self.model.text_projection(self.host_rows(np.stack(texts))), ends])
        index = [i if i >= 0 else ends.shape[0] + i for i in pick]
        return ends[to_device(index, self.device)]  # [B, Ht]

    def host_rows(self, a: np.ndarray) -> torch.Tensor:
        """Host rows of thinker embeddings [n, Hth] on the device, in the talker's dtype."""
        return to_device(torch.from_numpy(np.asarray(a)), self.device, self.dtype)

    def _rows(self, a: np.ndarray, rows: torch.Tensor) -> torch.Tensor:
        return to_device(torch.from_numpy(np.asarray(a)[rows.numpy()]), self.device, self.dtype)


def user_positions(ids: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    """Positions inside user turns: from a user turn's <|im_start|> up to the next <|im_start|>."""
    pos = torch.arange(ids.shape[0], device=ids.device)
    starts = torch.where(ids == spec.im_start_id, pos, torch.full_like(pos, -1))
    prev = torch.cummax(starts, dim=0).values.clamp_min(0)
    role = ids[(prev + 1).clamp_max(ids.shape[0] - 1)]
    return role == spec.user_id


def multimodal_positions(ids: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    """Audio and image placeholders (prompts carry no video): the talker reads their thinker hidden
    states, as transformers' generate() does."""
    mm = ids == spec.audio_pad_id
    return mm if spec.image_pad_id is None else mm | (ids == spec.image_pad_id)
