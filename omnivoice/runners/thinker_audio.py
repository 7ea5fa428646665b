"""The thinker's audio encoder work: the clips of waiting requests, and the speech of conversations
still being spoken, encoded a bounded number of windows per step.

A thinker step encodes at most `budget` attention windows, in one padded forward of the
`AudioEncoder`: first the windows of the waiting requests in queue order, then windows sent ahead.
So a burst of long utterances is encoded over several steps, each one short enough that the running
requests' decoding goes on between them, and a request is admitted to prefill once every clip it needs
is encoded.

Windows sent ahead (`ahead`) are a conversation's speech while the caller still speaks: every
completed window of the turn's features. When the turn's request comes, each window of its clips whose
features are those of a window sent ahead (same bits: a digest of them) takes that window's output, so
only the rest (the turn's tail) is encoded then. A window whose features changed since (the finished
clip's louder maximum raised the floor of its quiet frames) matches nothing and is encoded again, so
the result is always the clip's own encoding. Windows sent ahead stay after use (the last
`AHEAD_WINDOWS` of each of the most recent conversations), since a request that used them may be a
speculative response that is dropped when the caller speaks on: the turn's own request uses them again.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from omnivoice.runners.audio_encoder import AudioEncoder, Window
from omnivoice.types import GenerationRequest

AHEAD_WINDOWS = 8  # windows kept per conversation sent ahead (its turn's speech so far)


@dataclass
class _Slot:
    window: Window
    out: torch.Tensor | None = None  # [tokens, out_dim] once encoded


def _digest(mel: np.ndarray | torch.Tensor) -> bytes:
    data = mel.numpy() if isinstance(mel, torch.Tensor) else mel
    return hashlib.blake2b(np.ascontiguousarray(data).tobytes(), digest_size=16).digest()


class ThinkerAudio:
    """Encodes requests' clips and windows sent ahead, `budget` windows per `step` at most; at most
    `conversations` conversations' windows sent ahead are kept (the least recently sent are dropped)."""

    def __init__(self, encoder: AudioEncoder, budget: int, conversations: int) -> None:
        self.encoder = encoder
        self.budget = budget
        self.conversations = conversations
        self._requests: dict[str, dict[int, list[_Slot]]] = {}  # request id -> clip index -> windows
        self._ahead: OrderedDict[str, dict[bytes, _Slot]] = OrderedDict()  # cache key -> digest -> window
        self.ahead_used = 0  # windows of requests that came encoded ahead (since the start)

    # ---- what to encode ------------------------------------------------------------------------
    def ahead(self, cache_key: str, features: Sequence[np.ndarray]) -> None:
        """Whole windows [n_mels, window frames] of speech still being spoken in `cache_key`."""
        windows = self._ahead.pop(cache_key, {})
        for mel in features:
            if mel.ndim != 2 or mel.shape != (self.encoder.n_mels, self.encoder.window):
                raise ValueError(
                    f"a window sent ahead must be [{self.encoder.n_mels}, {self.encoder.window}]"
                )
            windows.setdefault(_digest(mel), _Slot(Window(torch.from_numpy(mel), alone=False)))
        while len(windows) > AHEAD_WINDOWS:  # the oldest first: a turn's windows arrive in order
            windows.pop(next(iter(windows)))
        self._ahead[cache_key] = windows
        while len(self._ahead) > self.conversations:
            self._ahead.popitem(last=False)

    def plan(self, request: GenerationRequest, clips: Iterable[int]) -> int:
        """Make the windows of `request`'s clips (indices into its prompt's audio) known; returns how
        many of its windows are still to encode."""
        planned = self._requests.setdefault(request.request_id, {})
        ahead = self._ahead.get(request.cache_key) if request.cache_key else None
        for i in clips:
            if i in planned:
                continue
            slots = [_Slot(w) for w in self.encoder.windows(request.prompt.audio_features[i])]
            if ahead:
                for n, slot in enumerate(slots):
                    if slot.window.mel.shape[1] == self.encoder.window:
                        # kept for the turn's next request (a speculative one may be dropped)
                        found = ahead.get(_digest(slot.window.mel))
                        if found is not None:
                            slots[n] = found
                            self.ahead_used += 1
            planned[i] = slots
        return self.missing(request.request_id)

    def planned_ids(self) -> list[str]:
        """The requests whose audio is planned (waiting to be encoded or admitted)."""
        return list(self._requests)

    def ready(self, request_id: str) -> bool:
        """Whether the request's audio is planned and all encoded."""
        return request_id in self._requests and not self.missing(request_id)

    def missing(self, request_id: str) -> int:
        """Windows of the request still to encode."""
        return sum(s.out is None for slots in self._requests.get(request_id, {}).values() for s in slots)

    def has_work(self) -> bool:
        return any(s.out is None for windows in self._ahead.values() for s in windows.values()) or any(
            self.missing(rid) for rid in self._requests
        )

    # ---- encoding ------------------------------------------------------------------------------
    def step(
        self, waiting: Iterable[GenerationRequest], clips: Callable[[GenerationRequest], list[int]]
    ) -> int:
        """Encode up to `budget` windows: those of the waiting requests in order (a request's clips,
        `clips(request)`, are planned as it comes within reach), then windows sent ahead. Returns how
        many were encoded."""
        todo: list[_Slot] = []
        for req in waiting:
            if req.request_id not in self._requests:
                self.plan(req, clips(req))
            todo += [s for slots in self._requests[req.request_id].values() for s in slots if s.out is None]
            if len(todo) >= self.budget:
                break
        todo += [s for windows in self._ahead.values() for s in windows.values() if s.out is None]
        todo = todo[: self.budget]
        self._encode(todo)
        return len(todo)

    def encode_now(self, request_id: str) -> None:
        """Encode whatever the request still lacks, whatever the budget (its prompt's cached part
        shrank between planning and admission)."""
        self._encode(
            [s for slots in self._requests.get(request_id, {}).values() for s in slots if s.out is None]
        )

    def _encode(self, slots: list[_Slot]) -> None:
        if slots:
            for slot, out in zip(slots, self.encoder([s.window for s in slots]), strict=True):
                slot.out = out

    # ---- handing out and forgetting --------------------------------------------------------------
    def take(self, request_id: str) -> dict[int, torch.Tensor]:
        """Each planned clip's encoder output [tokens, out_dim] (all encoded), and forget the request."""
        planned = self._requests.pop(request_id, {})
        out: dict[int, torch.Tensor] = {}
        for i, slots in planned.items():
            parts = [s.out for s in slots]
            if any(p is None for p in parts):
                raise RuntimeError(f"request {request_id}: audio clip {i} is not encoded yet")
            out[i] = torch.cat(parts)  # type: ignore[arg-type]
        return out

    def drop(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def forget(self, cache_key: str) -> None:
        self._ahead.pop(cache_key, None)
