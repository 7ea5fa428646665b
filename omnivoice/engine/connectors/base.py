"""The connector contract: many writers, one reader."""

from __future__ import annotations

from typing import Any, Protocol


class Connector(Protocol):
    def put(self, msg: Any) -> None:
        """Send one message; never blocks for long (queues are unbounded, the scheduler bounds work)."""
        ...

    def put_many(self, msgs: list[Any]) -> None:
        """Send `msgs` in order, as cheaply as the transport allows (one transfer where it can)."""
        ...

    def get(self, timeout: float | None) -> Any | None:
        """Next message, waiting up to `timeout` seconds (None: forever); None if nothing came."""
        ...

    def drain(self) -> list[Any]:
        """Every message available now, without waiting."""
        ...

    def close(self) -> None: ...
