"""Per-request bookkeeping of the engine: a request's output queue, detokenizer and stage results."""

from __future__ import annotations

import asyncio

from omnivoice.engine.detokenizer import IncrementalDetokenizer
from omnivoice.messages import StageFinished
from omnivoice.types import EngineOutput, GenerationRequest


class RequestState:
    def __init__(
        self, request: GenerationRequest, loop: asyncio.AbstractEventLoop, detok: IncrementalDetokenizer
    ):
        self.request = request
        self.loop = loop
        self.queue: asyncio.Queue[EngineOutput] = asyncio.Queue()
        self.detok = detok
        self.thinker: StageFinished | None = None
        self.talker: StageFinished | None = None
        self.audio: StageFinished | None = None
        self.audio_index = 0
        self.done = False

    def emit(self, out: EngineOutput) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, out)
