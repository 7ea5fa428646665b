"""Which replica of each stage serves a request: the least loaded, chosen once (sticky)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from omnivoice.types import GenerationRequest

AFFINITY_MEMORY = 65536  # conversations remembered for thinker affinity


class ReplicaRouter:
    """Least-loaded assignment per stage. A conversation (`cache_key`) keeps its thinker replica, since
    its prefix cache lives there. Not thread-safe: the engine calls it under its lock."""

    def __init__(self, thinker: int, talker: int, code2wav: int) -> None:
        self._load = [[0] * thinker, [0] * talker, [0] * code2wav]
        self._affinity: OrderedDict[str, int] = OrderedDict()

    def assign(self, request: GenerationRequest) -> tuple[int, int, int]:
        key = request.cache_key
        thinker = self._affinity.get(key, -1) if key else -1
        if thinker < 0:
            thinker = _least(self._load[0])
        if key:
            self._affinity[key] = thinker
            self._affinity.move_to_end(key)
            while len(self._affinity) > AFFINITY_MEMORY:
                self._affinity.popitem(last=False)
        talker = _least(self._load[1]) if request.want_audio else 0
        code2wav = _least(self._load[2]) if request.want_audio else 0
        route = (thinker, talker, code2wav)
        self._count(route, request.want_audio, +1)
        return route

    def full_stage(self, request: GenerationRequest, capacity: Sequence[int]) -> int | None:
        """The first stage (0 thinker, 1 talker, 2 code2wav) whose replica `assign` would pick for
        `request` already holds `capacity[stage]` requests; None if it fits everywhere."""
        key = request.cache_key
        thinker = self._affinity.get(key, -1) if key else -1
        picks = [thinker if thinker >= 0 else _least(self._load[0])]
        if request.want_audio:
            picks += [_least(self._load[1]), _least(self._load[2])]
        for stage, replica in enumerate(picks):
            if self._load[stage][replica] >= capacity[stage]:
                return stage
        return None

    def release(self, request: GenerationRequest) -> None:
        self._count(request.route, request.want_audio, -1)

    def thinker_for(self, cache_key: str) -> int:
        """The conversation's thinker replica, chosen now (the least loaded) if it has none yet; no
        request is counted."""
        thinker = self._affinity.get(cache_key)
        if thinker is None:
            thinker = self._affinity[cache_key] = _least(self._load[0])
            while len(self._affinity) > AFFINITY_MEMORY:
                self._affinity.popitem(last=False)
        return thinker

    def thinker_of(self, cache_key: str) -> int | None:
        return self._affinity.get(cache_key)

    def forget(self, cache_key: str) -> None:
        self._affinity.pop(cache_key, None)

    @property
    def conversations(self) -> int:
        """Conversations whose thinker replica is remembered."""
        return len(self._affinity)

    def load(self) -> list[list[int]]:
        return [list(x) for x in self._load]

    def _count(self, route: tuple[int, int, int], audio: bool, delta: int) -> None:
        stages = 3 if audio else 1
        for stage in range(stages):
            self._load[stage][route[stage]] += delta


def _least(load: list[int]) -> int:
    return min(range(len(load)), key=load.__getitem__)
