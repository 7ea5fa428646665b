"""Per-request bookkeeping of the engine: a request's output queue, detokenizer and stage results.

The dispatcher thread hands each stage output of a request to its `RequestState`, which turns it into
what the caller's iterator yields (text deltas, audio chunks) and says when the request is complete.
"""

from __future__ import annotations

import asyncio

from omnivoice.engine.detokenizer import IncrementalDetokenizer
from omnivoice.messages import PcmOutput, StageFinished, TokenOutput
from omnivoice.types import (
    AudioChunk,
    EngineOutput,
    Finished,
    FinishReason,
    GenerationRequest,
    TextDelta,
    Usage,
)


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

    def on_tokens(self, msg: TokenOutput) -> None:
        self.emit(TextDelta(msg.request_id, msg.token_ids, self.detok.add(msg.token_ids)))

    def on_pcm(self, msg: PcmOutput, sample_rate: int) -> None:
        self.emit(AudioChunk(msg.request_id, self.audio_index, msg.pcm, sample_rate))
        self.audio_index += 1

    def on_stage_finished(self, msg: StageFinished) -> FinishReason | None:
        """Record a stage's end of the request (not an error: the engine fails those); the request's
        finish reason once every stage it needs is done, else None."""
        if msg.stage == "thinker":
            self.thinker = msg
            tail = self.detok.flush()
            if tail:
                self.emit(TextDelta(msg.request_id, (), tail))
        elif msg.stage == "talker":
            self.talker = msg  # whether the audio ran to its end code or was cut at a frame limit
        elif msg.stage == "code2wav":
            self.audio = msg
        spoken = self.talker is not None and self.audio is not None
        if self.thinker is None or not (spoken or not self.request.want_audio):
            return None
        # audio cut at the talker's frame limit ends the response as a length limit does
        cut = self.talker is not None and self.talker.reason == "length"
        return "length" if cut else self.thinker.reason  # type: ignore[return-value]

    def finish(self, reason: FinishReason, error: str | None = None) -> None:
        """End the caller's iterator with `Finished` (once)."""
        self.done = True
        self.emit(Finished(self.request.request_id, reason, self.usage(), error=error))

    def usage(self) -> Usage:
        t = self.thinker
        return Usage(
            prompt_tokens=t.prompt_tokens if t else len(self.request.prompt.input_ids),
            completion_tokens=t.count if t else self.detok.count,
            audio_frames=self.audio.count if self.audio else 0,
        )
