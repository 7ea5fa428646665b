"""Memory given back to the system after a burst.

glibc's allocator keeps the heap a burst of large requests grew (decoded images, prompts, JSON
bodies) for reuse, so the server's resident memory stays at its peak long after the burst. While
the server runs, `MemoryTrimmer` checks its resident memory every `interval_s` and, when it grew by
more than `slack_bytes` since the last trim, asks the allocator to return its free pages
(`malloc_trim`), in a worker thread (the call releases the interpreter while it runs). On a libc
without `malloc_trim` (musl, macOS) it does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable

from omnivoice.engine.process_stats import process_stats

log = logging.getLogger(__name__)


def _libc_trim() -> Callable[[], object] | None:
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    return lambda: trim(0)


class MemoryTrimmer:
    """Trims the allocator's free memory when the process grew by `slack_bytes` since the last trim."""

    def __init__(self, interval_s: float, slack_bytes: int = 32 * 1024 * 1024) -> None:
        self.interval_s = interval_s
        self.slack_bytes = slack_bytes
        self.trims = 0
        self._trim = _libc_trim()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._trim is not None and self.interval_s > 0 and self._task is None:
            self._task = asyncio.create_task(self._run(), name="memory-trim")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        settled = process_stats().rss_bytes
        while True:
            await asyncio.sleep(self.interval_s)
            rss = process_stats().rss_bytes
            if rss - settled > self.slack_bytes:
                settled = await asyncio.to_thread(self.trim_now)
            else:
                settled = min(settled, rss)

    def trim_now(self) -> int:
        """Return free heap pages to the system now; the resident memory after."""
        if self._trim is not None:
            self._trim()
            self.trims += 1
        rss = process_stats().rss_bytes
        log.debug("memory trimmed: resident %d MB", rss >> 20)
        return rss
