"""The priority board: how the stage workers that share a device learn of each other's urgent work.

Each worker publishes the class of the most urgent work it can do now (runners/priority.py:
DRY, FIRST, NORMAL, AHEAD) or that it is idle; a worker whose own work is all AHEAD gives way for a
moment while a worker on its device publishes DRY or FIRST work (engine/stage.py). The board is one
small integer per worker: a shared-memory array made by the pipeline before the stage processes start
(so it needs no name, and goes with them), or a plain list when every worker is a thread. Each worker
writes only its own entry and a stale read costs at most one step, so there is no lock.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableSequence
from dataclasses import dataclass
from typing import Any

from omnivoice.runners.priority import Priority

IDLE = len(Priority)  # an entry's value while its worker has nothing to do


class PriorityBoard:
    """One entry per stage worker: the value of its most urgent `Priority`, or IDLE."""

    def __init__(self, entries: MutableSequence[int]) -> None:
        self._entries = entries

    @classmethod
    def local(cls, size: int) -> PriorityBoard:
        """A board for workers that are threads of one process."""
        return cls([IDLE] * size)

    @classmethod
    def shared(cls, ctx: Any, size: int) -> PriorityBoard:
        """A board in shared memory, for stage processes started from `ctx` (a multiprocessing
        context) after it is made; it travels to them with their start arguments."""
        return cls(ctx.RawArray("b", [IDLE] * size))

    def __len__(self) -> int:
        return len(self._entries)

    def publish(self, index: int, urgency: Priority | None) -> None:
        self._entries[index] = IDLE if urgency is None else int(urgency)

    def read(self, index: int) -> Priority | None:
        value = self._entries[index]
        return None if value == IDLE else Priority(value)

    def urgent(self, indices: Iterable[int]) -> bool:
        """Whether any of the workers at `indices` holds DRY or FIRST work."""
        return any(self._entries[i] <= Priority.FIRST for i in indices)


@dataclass(frozen=True)
class Seat:
    """A worker's place on the board: its own entry, and those of the other workers on its device."""

    board: PriorityBoard
    index: int
    peers: tuple[int, ...]

    def publish(self, urgency: Priority | None) -> None:
        self.board.publish(self.index, urgency)

    def peer_urgent(self) -> bool:
        return self.board.urgent(self.peers)


def seats(board: PriorityBoard, devices: list[tuple[Any, str]]) -> dict[Any, Seat]:
    """The seat of each worker in `devices` ((worker key, device) pairs, one entry each, in board
    order): its peers are the other workers on the same device (every CPU worker shares the cores)."""
    if len(devices) != len(board):
        raise ValueError(f"a board of {len(board)} entries for {len(devices)} workers")
    out: dict[Any, Seat] = {}
    for i, (key, device) in enumerate(devices):
        peers = tuple(j for j, (_, other) in enumerate(devices) if j != i and _same_device(device, other))
        out[key] = Seat(board, i, peers)
    return out


def _same_device(a: str, b: str) -> bool:
    # "cuda" is "cuda:0" to torch; every CPU stage competes for the same cores
    def norm(d: str) -> str:
        return "cuda:0" if d == "cuda" else d.split(":")[0] if d.startswith("cpu") else d

    return norm(a) == norm(b)
