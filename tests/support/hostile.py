"""Helpers of the hostile-client probes (tests/hostile): a `/health` poller that keeps its slowest
answer, a peak-RSS sampler of this process (servers in tests run in it), and realtime reading."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from typing import Any

import httpx

from omnivoice.engine.process_stats import process_stats


class HealthProbe:
    """Polls `/health` from its own thread and keeps the slowest answer's latency and the count."""

    def __init__(self, base_url: str) -> None:
        self._client = httpx.Client(base_url=base_url, timeout=120)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health-probe", daemon=True)
        self.worst = 0.0
        self.count = 0
        self.failed = 0
        self.slow: list[tuple[float, float]] = []  # (monotonic start, seconds) of answers over 0.25 s

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.perf_counter()
            if self._client.get("/health").status_code != 200:
                self.failed += 1
            took = time.perf_counter() - began
            self.worst = max(self.worst, took)
            if took > 0.25:
                self.slow.append((time.monotonic() - took, took))
            self.count += 1
            time.sleep(0.01)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(120)
        self._client.close()


class PeakRss:
    """Samples this process's resident memory from its own thread and keeps the highest."""

    def __init__(self, every_s: float = 0.02) -> None:
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self.start = process_stats().rss_bytes
        self.peak = self.start

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, process_stats().rss_bytes)
            time.sleep(self._every_s)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        self.peak = max(self.peak, process_stats().rss_bytes)


class EventReader:
    """Reads a realtime WebSocket's events from a task, as they come (the server drops a client that
    leaves them unread), keeping them in order."""

    def __init__(self, ws: Any) -> None:
        self._ws = ws
        self.events: list[dict[str, Any]] = []
        self._counts: dict[tuple[str, str | None], int] = {}
        self._arrived = asyncio.Event()
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self._ws:
            event = json.loads(message)
            self.events.append(event)
            code = event.get("error", {}).get("code") if event["type"] == "error" else None
            for key in ((event["type"], None), (event["type"], code)) if code else ((event["type"], None),):
                self._counts[key] = self._counts.get(key, 0) + 1
            self._arrived.set()

    async def until(self, predicate: Any, timeout: float) -> dict[str, Any]:
        """The first event (from the start) for which `predicate` holds, waiting up to `timeout`."""
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            for event in self.events[seen:]:
                if predicate(event):
                    return event
            seen = len(self.events)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"no such event in {timeout} s; last: {[e['type'] for e in self.events[-5:]]}"
                )
            self._arrived.clear()
            if len(self.events) == seen:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), left)

    def count(self, kind: str, code: str | None = None) -> int:
        """Events of type `kind` so far (errors: of `code`, when given); kept as they come."""
        return self._counts.get((kind, code), 0)

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
