"""The engine's outputs for one response, read as they come so that a failure is seen at once.

A response sends audio at the pace of playback while the engine generates it faster, so the outputs
queue up behind the pacer. An engine failure (a stage worker died) would then reach the client only
after all the audio before it had played out. Here a task reads the engine stream as it comes; a
`Finished` with an error overtakes whatever is still queued, and `failed` is set at once so that the
pacer stops waiting.

A speculative response reads ahead before it may send anything: its outputs wait here, in order, until
the turn is confirmed (or are counted as wasted work when it is dropped: `held`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator

from omnivoice.types import EngineOutput, Finished


class ReadAhead:
    """Iterate over this instead of `outputs` (an `Engine.generate` stream, read from now on);
    `aclose()` when done: it stops reading and closes `outputs`, which aborts the request in every
    stage unless it had finished."""

    def __init__(self, outputs: AsyncGenerator[EngineOutput, None]) -> None:
        self._outputs = outputs
        self._queue: deque[EngineOutput] = deque()
        self._more = asyncio.Event()
        self.failed = asyncio.Event()  # a Finished with an error arrived: stop pacing
        self._failure: Finished | None = None
        self._error: Exception | None = None
        self._ended = False
        self._task = asyncio.create_task(self._read(), name="engine-read-ahead")

    async def _read(self) -> None:
        try:
            async for out in self._outputs:
                if isinstance(out, Finished) and out.finish_reason == "error":
                    self._failure = out
                    self.failed.set()
                    return
                self._queue.append(out)
                self._more.set()
        except Exception as e:  # the engine refused the request (overloaded, failed): for the reader
            self._error = e
        finally:
            self._ended = True
            self._more.set()

    def __aiter__(self) -> ReadAhead:
        return self

    async def __anext__(self) -> EngineOutput:
        while True:
            if self._failure is not None:  # the outputs queued before it are never sent
                self._queue.clear()
                failure, self._failure = self._failure, None
                return failure
            if self._queue:
                return self._queue.popleft()
            if self._ended:
                if self._error is not None:
                    error, self._error = self._error, None
                    raise error
                raise StopAsyncIteration
            self._more.clear()
            await self._more.wait()

    @property
    def held(self) -> tuple[EngineOutput, ...]:
        """The outputs read and not yet taken, in order."""
        return tuple(self._queue)

    async def aclose(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self._outputs.aclose()
