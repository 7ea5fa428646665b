"""The thinker's prefill: which waiting requests join a step's batched prefill, each one's inputs, and
the batch's forward through the decoder stack.

Requests are admitted in playback order, prefilled together: their first token is on the
time-to-first-audio path. At most `max_prefill_tokens` prompt tokens per step, and
`audio_windows_per_step` windows of their audio encoded, keep decode steps flowing; a request waits
until its audio is encoded. A request of a conversation whose prefix is cached prefills on top of that
prefix, in its slot, from the first position the prompt does not share with it.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Any

import torch

from omnivoice.config import ThinkerStage
from omnivoice.runners.decoder import DecoderStack
from omnivoice.runners.kv_cache import SlotKVCache
from omnivoice.runners.prefix_cache import PrefixCache, PrefixEntry, position_keys
from omnivoice.runners.priority import PlaybackPolicy
from omnivoice.runners.thinker_audio import ThinkerAudio
from omnivoice.runners.thinker_inputs import embed_prompt, needed_clips
from omnivoice.runners.thinker_seq import Pending, waiting_playback
from omnivoice.runners.vision_encoder import image_inputs
from omnivoice.types import GenerationRequest

if TYPE_CHECKING:
    from omnivoice.models.loader import ModelSpec

log = logging.getLogger(__name__)


class PrefillAdmission:
    """The requests waiting for their prefill, in playback order, and the admission of the next
    step's batch: a KV slot for each (its conversation's cached one if any) and its new embeddings."""

    def __init__(
        self,
        model: Any,
        spec: ModelSpec,
        cfg: ThinkerStage,
        device: torch.device,
        cache: SlotKVCache,
        prefix: PrefixCache,
        audio: ThinkerAudio,
    ) -> None:
        self.model = model
        self.spec = spec
        self.cfg = cfg
        self.device = device
        self.cache = cache
        self.prefix = prefix
        self.audio = audio
        self.waiting: deque[GenerationRequest] = deque()
        self._keys: dict[str, list] = {}  # position keys of waiting requests whose audio is planned

    def drop(self, request_id: str) -> None:
        self.waiting = deque(r for r in self.waiting if r.request_id != request_id)
        self._keys.pop(request_id, None)

    def can_admit(self, running: int) -> bool:
        """Whether a waiting request may start beside `running` others: a batch row and a slot (a free
        one, or a cached prefix's to evict) are left."""
        room = self.cache.free_slots > 0 or len(self.prefix) > 0
        return bool(self.waiting) and running < self.cfg.max_batch and room

    def admit(
        self, policy: PlaybackPolicy, running: int, admitted: dict[str, Pending | None]
    ) -> list[Pending]:
        """This step's prefill batch, beside `running` requests: the waiting requests in playback
        order while they fit, after this step's share of their audio is encoded. Each is entered in
        `admitted` as it leaves the queue (None until its slot and inputs are made), so a failure
        while admitting it or prefilling the batch is known to be theirs."""
        if len(self.waiting) > 1:
            self.waiting = deque(policy.order(self.waiting, waiting_playback))
        self.audio.step(self.waiting, self._clips)
        batch: list[Pending] = []
        budget = self.cfg.max_prefill_tokens
        while self.can_admit(running + len(batch)) and self._next_fits(budget if batch else None):
            req = self.waiting.popleft()
            admitted[req.request_id] = None
            batch.append(self._admit(req))
            admitted[req.request_id] = batch[-1]
            budget -= batch[-1].embeds.shape[1]
        return batch

    def _clips(self, req: GenerationRequest) -> list[int]:
        """The audio clips of a waiting request past its conversation's cached prefix (its position
        keys are kept for its admission)."""
        keys, _, reuse = self._match(req, self._keys.get(req.request_id))
        if req.cache_key:
            self._keys[req.request_id] = keys
        return needed_clips(req.prompt, self.spec.audio_pad_id, reuse)

    def _next_fits(self, tokens_left: int | None) -> bool:
        """Whether the head of the queue may join this step's prefill: its audio is encoded, and its
        prompt fits the tokens left (None: the first of the batch, which always fits)."""
        req = self.waiting[0]
        fits = tokens_left is None or len(req.prompt.input_ids) <= tokens_left
        return fits and self.audio.ready(req.request_id)

    def _match(self, req: GenerationRequest, keys: list | None) -> tuple[list, PrefixEntry | None, int]:
        """`req`'s position keys, its conversation's cached prefix and how much of it the prompt reuses
        (at least one position is computed, for the first token's logits)."""
        if not req.cache_key:
            return [], None, 0
        keys = (
            position_keys(req.prompt, self.spec.audio_pad_id, self.spec.image_pad_id)
            if keys is None
            else keys
        )
        entry, reuse = self.prefix.match(req.cache_key, keys)
        return keys, entry, min(reuse, len(req.prompt.input_ids) - 1)

    def _admit(self, req: GenerationRequest) -> Pending:
        """Take a KV slot for `req` (its conversation's cached one if any) and embed what is new."""
        keys, entry, reuse = self._match(req, self._keys.pop(req.request_id, None))
        if entry is not None and req.cache_key:  # an entry is only found under a key
            slot = self.prefix.take(req.cache_key)  # the conversation's slot: prefill on top of it in place
        else:
            if self.cache.free_slots == 0:
                self.prefix.evict_one()
            slot = self.cache.alloc()
        try:
            return self._inputs(req, slot, reuse, entry, keys)
        except BaseException:
            self.cache.release(slot)  # the request fails: its slot (and any cached prefix in it) is lost
            raise

    def _inputs(
        self, req: GenerationRequest, slot: int, reuse: int, entry: PrefixEntry | None, keys: list
    ) -> Pending:
        """`req`'s new embeddings (and images) on top of the `reuse` cached positions in `slot`."""
        # the cached part may have shrunk since the audio was planned (its entry evicted): encode the rest
        if self.audio.plan(req, needed_clips(req.prompt, self.spec.audio_pad_id, reuse)):
            self.audio.encode_now(req.request_id)
        audio = self.audio.take(req.request_id)
        embeds = embed_prompt(self.model, self.spec.audio_pad_id, req.prompt, reuse, self.device, audio)
        images, delta = None, 0
        if req.prompt.image_grids:
            if self.spec.image_pad_id is None:
                raise ValueError("the served model takes no images")
            merge = self.model.config.vision_config.spatial_merge_size
            images, delta = image_inputs(self.model, req.prompt, self.spec.image_pad_id, merge, embeds, reuse)
        return Pending(req, slot, reuse, entry if reuse > 0 else None, keys, embeds, images, delta)


def fitting_groups(batch: list[Pending], max_len: int) -> list[list[Pending]]:
    """`batch` in order, cut into groups whose right-padded prefill fits a slot of `max_len`
    positions: a group writes from its rows' latest start for its longest row's length, so a row on top
    of a long cached prefix and one with a long new prompt, each fitting alone, overrun it together."""
    groups: list[list[Pending]] = []
    start = length = 0
    for p in batch:
        n = p.embeds.shape[1]
        if groups and max(start, p.reuse) + max(length, n) <= max_len:
            groups[-1].append(p)
            start, length = max(start, p.reuse), max(length, n)
        else:
            groups.append([p])
            start, length = p.reuse, n
    return groups


def forward_prefill(
    stack: DecoderStack, cache: SlotKVCache, batch: list[Pending], accept: int
) -> tuple[torch.Tensor, dict[int, torch.Tensor], list[int]]:
    """Run a prefill batch through `stack`, right-padded to its longest row: the last layer's hidden
    states [B, T, H], the kept layers' (0 and `accept`), and each row's new positions."""
    lengths = [p.embeds.shape[1] for p in batch]
    if len(batch) > 1:
        log.debug("prefilling %d requests together (%d tokens)", len(batch), sum(lengths))
    longest = max(lengths)
    embeds = torch.cat(
        [torch.nn.functional.pad(p.embeds, (0, 0, 0, longest - p.embeds.shape[1])) for p in batch]
    )  # [B, T, H], right-padded
    slot_ids, starts = [p.slot for p in batch], [p.reuse for p in batch]
    for p in batch:
        cache.rope_delta[p.slot] = p.rope_delta
    if any(p.images is not None for p in batch):
        rope, deepstack = _image_rows(batch, longest)
        h, kept = stack.forward(
            embeds, cache, slot_ids, starts, (0, accept), lengths, rope.to(embeds.device), deepstack
        )
    else:
        h, kept = stack.prefill(embeds, cache, slot_ids, starts, keep=(0, accept), lengths=lengths)
    return h, kept, lengths


def _image_rows(batch: list[Pending], t: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A prefill batch's rotary positions [3, B, t] and deepstack inputs (each [B, t, H]): a row
    without images at its cache positions with no deepstack; the padding repeats its row's last."""
    rows, stacks = [], []
    layers = max(len(p.images.deepstack) for p in batch if p.images is not None)
    for p in batch:
        n, hidden = p.embeds.shape[1], p.embeds.shape[2]
        if p.images is None:
            rope = (p.reuse + torch.arange(n)).expand(3, -1)
            deepstack = [p.embeds.new_zeros(n, hidden)] * layers
        else:
            rope, deepstack = p.images.rope.cpu(), p.images.deepstack
        rows.append(torch.cat([rope, rope[:, -1:].expand(3, t - n)], dim=1))
        stacks.append([torch.nn.functional.pad(d, (0, 0, 0, t - n)) for d in deepstack])
    return torch.stack(rows, dim=1), [torch.stack(layer) for layer in zip(*stacks, strict=True)]
