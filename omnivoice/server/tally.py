"""Figures every front end counts against together (`SharedTally`): the server's requests in flight
and promised audio streams (server/lifecycle.py's Admission), its realtime sessions
(`realtime.max_sessions`), and each API key's open sessions and request bucket
(server/auth/limits.py). A front end alone keeps them in a `Tally` of its own.

A shared tally is one array of named numbers in shared memory, made by the supervisor before it
starts the front ends, and one lock (a process-shared semaphore): a check-and-add is one critical
section of a few instructions, so a limit holds across the front ends exactly, as it does in one.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
from collections.abc import Iterator, Sequence
from typing import Any


class Tally:
    """Named numbers of one process."""

    def __init__(self, names: Sequence[str] = ()) -> None:
        self._values: dict[str, float] = dict.fromkeys(names, 0.0)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the tally for a read-modify-write of several numbers (nothing to hold here)."""
        yield

    def __contains__(self, name: str) -> bool:
        return name in self._values

    def __getitem__(self, name: str) -> float:
        return self._values.get(name, 0.0)

    def names(self) -> list[str]:
        return list(self._values)

    def __setitem__(self, name: str, value: float) -> None:
        self._values[name] = value

    def add(self, name: str, delta: float, limit: float | None = None) -> bool:
        """Add `delta` to `name`, unless that takes it past `limit` (then False, unchanged)."""
        with self.locked():
            value = self[name] + delta
            if limit is not None and delta > 0 and value > limit:
                return False
            self[name] = value
            return True


class SharedTally(Tally):
    """Named numbers shared by processes: made in the supervisor (every name known then), handed to
    each front end at its start."""

    def __init__(self, names: Sequence[str], ctx: Any | None = None) -> None:
        ctx = ctx or mp.get_context("spawn")
        self._index = {name: i for i, name in enumerate(dict.fromkeys(names))}
        self._array = ctx.Array("d", max(1, len(self._index)), lock=True)
        self._lock = self._array.get_lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"_index": self._index, "_array": self._array}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = self._array.get_lock()

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        with self._lock:
            yield

    def __contains__(self, name: str) -> bool:
        return name in self._index

    def names(self) -> list[str]:
        return list(self._index)

    def __getitem__(self, name: str) -> float:
        i = self._index.get(name)
        return float(self._array.get_obj()[i]) if i is not None else 0.0

    def __setitem__(self, name: str, value: float) -> None:
        i = self._index.get(name)
        if i is None:
            raise KeyError(f"{name!r} is not a figure the front ends share")
        self._array.get_obj()[i] = value
