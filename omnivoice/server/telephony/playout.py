"""What the caller has heard, from marks: a `mark` follows the audio it closes, and the carrier echoes
it once that audio has played.

Each mark carries the `on_sent` callbacks of the audio deltas it closes; they run when it is echoed,
so an item's ledger counts played audio, as for a transport that plays out itself. On `clear` the
carrier drops the audio it holds and echoes the marks still pending: those were not played, and their
callbacks never run. The played position is the last mark echoed before the clear.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class _Mark:
    item_id: str
    on_played: tuple[Callable[[], None], ...]


class Playout:
    def __init__(self) -> None:
        self._seq = 0
        self._pending: dict[str, _Mark] = {}  # sent, not echoed yet; in the order sent
        self._stale: set[str] = set()  # pending at a clear: their echo says nothing
        self._item: str | None = None  # the item whose audio was sent last
        self._unmarked = False  # audio was sent after the last mark
        self.played_marks = 0

    @property
    def playing(self) -> bool:
        """Audio was sent that the carrier has not confirmed played."""
        return bool(self._pending) or self._unmarked

    @property
    def pending(self) -> int:
        return len(self._pending)

    def sent_audio(self, item_id: str) -> None:
        self._item = item_id
        self._unmarked = True

    def sent_mark(self, item_id: str, on_played: tuple[Callable[[], None], ...]) -> str:
        """Register a mark closing the audio sent so far; returns the name to send."""
        self._seq += 1
        name = f"ov{self._seq}"
        self._pending[name] = _Mark(item_id, on_played)
        self._unmarked = False
        return name

    def echoed(self, name: str) -> bool:
        """The carrier echoed mark `name`; False for a name we never sent (or already had echoed)."""
        if name in self._stale:
            self._stale.discard(name)
            return True
        if name not in self._pending:
            return False
        while self._pending:  # marks play in order: the ones before it have played too
            first = next(iter(self._pending))
            mark = self._pending.pop(first)
            self.played_marks += 1
            for callback in mark.on_played:
                callback()
            if first == name:
                break
        return True

    def clear(self) -> str | None:
        """The carrier is told to drop its audio: the id of the item that was playing, None if none."""
        if not self.playing:
            return None
        self._stale.update(self._pending)
        self._pending.clear()
        self._unmarked = False
        return self._item
