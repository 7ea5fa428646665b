"""Memory given back: after a burst of allocations is freed, `MemoryTrimmer` returns the allocator's
free pages, and the process's resident memory falls back near where it was."""

from __future__ import annotations

import asyncio

from omnivoice.engine.process_stats import process_stats
from omnivoice.server.memory_trim import MemoryTrimmer

BLOCK = 100_000  # bytes: under glibc's mmap threshold, so the blocks come from (and stay in) the heap
BLOCKS = 3000  # 300 MB


def _burst() -> list[bytearray]:
    blocks = [bytearray(BLOCK) for _ in range(BLOCKS)]
    for b in blocks:
        b[::4096] = b"x" * len(b[::4096])  # touch every page: resident
    return blocks


def test_a_trim_returns_a_freed_burst() -> None:
    trimmer = MemoryTrimmer(interval_s=0)
    # free pages earlier tests left in this process go back first, so the burst's pages are all new
    # resident memory (else it reuses them, and the process grows by less than the burst)
    before = trimmer.trim_now()
    blocks = _burst()
    peak = process_stats().rss_bytes
    grown = peak - before
    assert grown > 150e6, grown
    keep = blocks[-1:]  # a live block at the heap's top: freeing the rest leaves a hole only a trim returns
    del blocks
    after = trimmer.trim_now()
    assert trimmer.trims == 2 and keep
    assert after - before < 0.2 * grown, f"{(after - before) / 1e6:.0f} MB of {grown / 1e6:.0f} MB kept"


async def test_the_trimmer_trims_when_the_process_has_grown() -> None:
    trimmer = MemoryTrimmer(interval_s=0.05, slack_bytes=32 * 1024 * 1024)
    trimmer.start()
    await asyncio.sleep(0.2)  # it has read the resident memory before the burst
    try:
        blocks = _burst()
        keep = blocks[-1:]  # (else freeing them shrinks the heap from its top without a trim)
        del blocks
        for _ in range(200):
            if trimmer.trims:
                break
            await asyncio.sleep(0.05)
    finally:
        await trimmer.close()
    assert trimmer.trims >= 1 and keep
