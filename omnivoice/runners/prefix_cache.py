"""The thinker's per-conversation prefix cache.

A voice session sends the whole conversation as every turn's prompt. Its KV cache (and the layer-0
embeddings and accept-layer hidden states the talker reads) is kept after each turn in a spare KV
slot, keyed by the session, so the next turn prefills only the new positions. A session can also warm
the cache with the start of a turn while the user is still speaking (early start).

Positions are compared by content: a token id, or for an audio placeholder the digest of that audio's
features and the index inside it, likewise for an image placeholder with its patches, so two
different clips or images never share cached positions.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import numpy as np
import torch

from omnivoice.types import Prompt


@dataclass
class PrefixEntry:
    slot: int
    keys: list[Hashable]  # content of each cached position
    embeds: torch.Tensor  # [L, H] layer-0 embeddings
    hidden: torch.Tensor  # [L, H] hidden state of the talker's accept layer


def position_keys(prompt: Prompt, audio_pad_id: int, image_pad_id: int | None = None) -> list[Hashable]:
    digest = {
        audio_pad_id: ("audio", [_digest(f) for f in prompt.audio_features]),
        image_pad_id: ("image", [_digest(p) for p in prompt.image_patches]),
    }
    runs = {audio_pad_id: -1, image_pad_id: -1}
    keys: list[Hashable] = []
    index = 0
    previous = None
    for tok in prompt.input_ids:
        if tok in digest:
            kind, digests = digest[tok]
            if previous != tok:
                runs[tok], index = runs[tok] + 1, 0
            run = runs[tok]
            keys.append((kind, digests[run] if run < len(digests) else None, index))
            index += 1
        else:
            keys.append(tok)
        previous = tok
    return keys


def _digest(a: np.ndarray) -> str:
    return hashlib.blake2b(a.tobytes(), digest_size=12).hexdigest()


def common_prefix(a: list[Hashable], b: list[Hashable]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class PrefixCache:
    """LRU of PrefixEntry by conversation key; `release(slot)` frees an evicted entry's KV slot."""

    def __init__(self, capacity: int, release: Callable[[int], None]) -> None:
        self.capacity = capacity
        self._release = release
        self._entries: OrderedDict[str, PrefixEntry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def match(self, key: str, keys: list[Hashable]) -> tuple[PrefixEntry | None, int]:
        entry = self._entries.get(key)
        if entry is None:
            return None, 0
        self._entries.move_to_end(key)
        return entry, common_prefix(entry.keys, keys)

    def put(self, key: str, entry: PrefixEntry) -> None:
        if self.capacity <= 0:
            self._release(entry.slot)
            return
        self.drop(key)
        self._entries[key] = entry
        while len(self._entries) > self.capacity:
            self.evict_one()

    def take(self, key: str) -> int:
        """Remove `key`'s entry and hand its slot to the caller (who now owns it)."""
        return self._entries.pop(key).slot

    def drop(self, key: str) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self._release(old.slot)

    def evict_one(self) -> bool:
        """Free the least recently used entry's slot; False if there is none."""
        for key in self._entries:
            self.drop(key)
            return True
        return False
