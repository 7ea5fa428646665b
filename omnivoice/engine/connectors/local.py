"""In-process connector: a thread-safe queue, messages passed by reference."""

from __future__ import annotations

import queue
from typing import Any


class LocalConnector:
    def __init__(self) -> None:
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def put(self, msg: Any) -> None:
        self._q.put(msg)

    def put_many(self, msgs: list[Any]) -> None:
        for msg in msgs:
            self._q.put(msg)

    def get(self, timeout: float | None) -> Any | None:
        try:
            return self._q.get(timeout=timeout)
        except queue.Empty:
            return None

    def drain(self) -> list[Any]:
        out = []
        while True:
            try:
                out.append(self._q.get_nowait())
            except queue.Empty:
                return out

    def close(self) -> None:
        pass
