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
import statistics
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import numpy as np
import torch

from omnivoice.types import Prompt

STALE_FLOOR_S = 30.0  # an entry unused for less than this is never taken for a gone-quiet caller's
WAITING_KEPT = 4096  # conversations whose next turn is awaited, at most (the oldest forgotten first)


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
    """PrefixEntry by conversation key, at most `capacity`; `release(slot)` frees a dropped entry's
    KV slot.

    Which entry goes when one must: voice sessions come back in turns, each after its answer has
    played out and the caller has spoken again, so the conversations cycle. Evicting the least
    recently used entry then keeps almost nothing once there are more sessions than entries (each
    entry is evicted just before its turn comes round again). Instead, in this order:
    - an entry not used for longer than `stale_after()` (twice the usual time from a stored answer
      to its conversation's next turn): its caller has gone quiet; the longest unused first;
    - a stored answer, the most recently stored first: its conversation's next turn is the
      furthest off, behind the answer's playback;
    - a turn still being spoken (a prefill started ahead of the caller's end of speech), the least
      recently used first: each is taken back within seconds.
    """

    def __init__(
        self, capacity: int, release: Callable[[int], None], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.capacity = capacity
        self._release = release
        self._clock = clock
        self._entries: OrderedDict[str, PrefixEntry] = OrderedDict()  # least recently used first
        self._used_at: dict[str, float] = {}
        self._answers: dict[str, float] = {}  # entries that are stored answers: when stored
        # conversations whose answer was stored and whose next turn has not come yet: when it was
        # stored (kept after an eviction, so the gap is measured whether the turn finds it or not)
        self._waiting_since: dict[str, float] = {}
        self._gaps: deque[float] = deque(maxlen=64)  # a stored answer to its conversation's next turn

    def __len__(self) -> int:
        return len(self._entries)

    def match(self, key: str, keys: list[Hashable]) -> tuple[PrefixEntry | None, int]:
        now = self._clock()
        since = self._waiting_since.pop(key, None)
        if since is not None:
            self._gaps.append(now - since)
        entry = self._entries.get(key)
        if entry is None:
            return None, 0
        self._entries.move_to_end(key)
        self._used_at[key] = now
        return entry, common_prefix(entry.keys, keys)

    def put(self, key: str, entry: PrefixEntry, answered: bool = True) -> None:
        """Keep `entry` as `key`'s conversation: a finished answer's (`answered`), or a turn still
        being spoken, which the turn's request takes back soon."""
        if self.capacity <= 0:
            self._release(entry.slot)
            return
        self.drop(key)
        now = self._clock()
        self._entries[key] = entry
        self._used_at[key] = now
        if answered:
            self._answers[key] = now
            self._waiting_since.pop(key, None)
            self._waiting_since[key] = now
            if len(self._waiting_since) > WAITING_KEPT:  # conversations that ended unannounced
                del self._waiting_since[next(iter(self._waiting_since))]
        while len(self._entries) > self.capacity:
            self.evict_one()

    def take(self, key: str) -> int:
        """Remove `key`'s entry and hand its slot to the caller (who now owns it)."""
        self._forget_entry(key)
        return self._entries.pop(key).slot

    def drop(self, key: str) -> None:
        old = self._entries.pop(key, None)
        self._forget_entry(key)
        if old is not None:
            self._release(old.slot)

    def forget(self, key: str) -> None:
        """The conversation has ended: drop its entry and what is known of its turns."""
        self.drop(key)
        self._waiting_since.pop(key, None)

    def stale_after(self) -> float | None:
        """Seconds unused after which an entry's caller counts as gone quiet: twice the median time
        from a stored answer to its conversation's next turn (None until a few were seen)."""
        if len(self._gaps) < 4:
            return None
        return max(STALE_FLOOR_S, 2.0 * statistics.median(self._gaps))

    def evict_one(self) -> bool:
        """Free one entry's slot, chosen as the class says; False if there is none."""
        victim = self._victim()
        if victim is None:
            return False
        self.drop(victim)
        return True

    def _victim(self) -> str | None:
        if not self._entries:
            return None
        oldest = next(iter(self._entries))
        stale = self.stale_after()
        if stale is not None and self._clock() - self._used_at[oldest] > stale:
            return oldest
        if self._answers:
            return max(self._answers, key=self._answers.__getitem__)
        return oldest

    def _forget_entry(self, key: str) -> None:
        self._used_at.pop(key, None)
        self._answers.pop(key, None)
