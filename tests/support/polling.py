"""Waiting for a condition in tests: one way, with a deadline and a message that says what never came."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

INTERVAL_S = 0.02


def wait_until(condition: Callable[[], object], timeout: float = 10.0, what: str = "the condition") -> None:
    """Poll `condition` until it is truthy; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:g} s")
        time.sleep(INTERVAL_S)


async def until(
    condition: Callable[[], object | Awaitable[object]], timeout: float = 10.0, what: str = "the condition"
) -> None:
    """`wait_until` for the event loop: `condition` may be a plain or an async callable."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if isinstance(result, Awaitable):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:g} s")
        await asyncio.sleep(INTERVAL_S)
