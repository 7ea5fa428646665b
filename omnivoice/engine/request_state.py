"""Per-request bookkeeping of the engine, and what it tells callers about the model."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from omnivoice.engine.chunks import StageFinished
from omnivoice.engine.detokenizer import IncrementalDetokenizer
from omnivoice.engine.types import EngineOutput, GenerationRequest


@dataclass(frozen=True)
class ModelInfo:
    served_name: str
    sample_rate: int
    voices: tuple[str, ...]
    default_voice: str
    max_prompt_tokens: int
    # Text longer than this (in characters) cannot fit max_prompt_tokens: no vocabulary entry stands for
    # more characters than max_prompt_chars / max_prompt_tokens. None: no tokenizer (token-id prompts).
    max_prompt_chars: int | None = None


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
