"""How often the engine may bring itself back: restarts are rate-limited, and held once it shuts down.

A worker or core that dies at every start must not loop forever, and a server that drains lets its
responses finish and then stops, so bringing anything back would only delay its exit. The stage
supervisor (engine/supervisor.py) and the engine client's core restarts (engine/core/client.py) each
keep one budget.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

MAX_RESTARTS = 5
RESTART_WINDOW_S = 600.0


class RestartBudget:
    """At most `max_restarts` within any `window_s`; none once held (not thread-safe: one caller)."""

    def __init__(
        self,
        max_restarts: int = MAX_RESTARTS,
        window_s: float = RESTART_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_restarts = max_restarts
        self.window_s = window_s
        self._clock = clock
        self._restarts: deque[float] = deque()
        self.held = False

    def hold(self) -> None:
        """Allow no restart from now on (the server is shutting down)."""
        self.held = True

    def refusal(self) -> str | None:
        """Why no restart may start now, or None if one may."""
        now = self._clock()
        while self._restarts and now - self._restarts[0] > self.window_s:
            self._restarts.popleft()
        if self.held:
            return "the engine is shutting down"
        if len(self._restarts) >= self.max_restarts:
            return f"{self.max_restarts} restarts in {self.window_s:.0f} s already"
        return None

    def spend(self) -> int:
        """Count a restart that starts now; how many the window holds with it."""
        self._restarts.append(self._clock())
        return len(self._restarts)
