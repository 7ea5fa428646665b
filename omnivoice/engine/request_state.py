"""Per-request bookkeeping of the engine: a request's output queue, detokenizer and stage results.

The dispatcher thread hands each stage output of a request to its `RequestState`, which turns it into
what the caller receives (text deltas, function calls, audio chunks) and says when the request is
complete. What it makes goes to the request's sink: the caller's asyncio queue (`queue_sink`), or the
engine core's channel to the server (engine/core/). A request that offers functions has its text
parsed as it streams: what is said goes out as TextDelta, the calls as ToolCallDelta and
ToolCallDone, in text order (only the first call when the request allows no parallel calls).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from omnivoice.engine.detokenizer import IncrementalDetokenizer
from omnivoice.messages import FirstAudioTimes, PcmOutput, StageFinished, TokenOutput
from omnivoice.models.tool_calls import ParsedOutput, ToolCallParser
from omnivoice.types import (
    AudioChunk,
    EngineOutput,
    Finished,
    FinishReason,
    FirstAudio,
    GenerationRequest,
    TextDelta,
    Usage,
)

Sink = Callable[[EngineOutput], None]  # takes a request's outputs, in order, on the dispatcher thread


def queue_sink(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[EngineOutput]) -> Sink:
    """A sink that puts each output on `queue`, in `loop` (from any thread)."""

    def put(out: EngineOutput) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, out)

    return put


class RequestState:
    def __init__(self, request: GenerationRequest, sink: Sink, detok: IncrementalDetokenizer):
        self.request = request
        self.emit = sink
        self.detok = detok
        self.thinker: StageFinished | None = None
        self.talker: StageFinished | None = None
        self.audio: StageFinished | None = None
        self.audio_index = 0
        self.submitted_at = time.monotonic()
        self.first_token_at: float | None = None  # monotonic seconds
        self.first_audio_at: float | None = None
        self.audio_s = 0.0  # seconds of audio received
        self.done = False
        self.parser = ToolCallParser(request.request_id) if request.tools else None
        self.max_calls = None if request.tools is None or request.tools.parallel else 1

    def on_tokens(self, msg: TokenOutput) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.monotonic()
        text = self.detok.add(msg.token_ids)
        if self.parser is None:
            self.emit(TextDelta(msg.request_id, msg.token_ids, text))
        else:
            self._emit_parsed(msg.token_ids, self.parser.feed(text))

    def _emit_parsed(self, token_ids: tuple[int, ...], outputs: list[ParsedOutput]) -> None:
        """The parser's outputs in order, said text as TextDelta; the step's token ids ride on its
        first TextDelta (an empty one when all of the step's text is in a call)."""
        rid = self.request.request_id
        for out in outputs:
            if isinstance(out, str):
                self.emit(TextDelta(rid, token_ids, out))
                token_ids = ()
            elif self.max_calls is None or out.index < self.max_calls:
                self.emit(out)
        if token_ids:
            self.emit(TextDelta(rid, token_ids, ""))

    def on_pcm(self, msg: PcmOutput, sample_rate: int) -> bool:
        """Hand on a piece of audio; True if it is the request's first."""
        first = self.first_audio_at is None
        if first:
            self.first_audio_at = time.monotonic()
        breakdown = self._first_audio(msg.first_audio) if first and msg.first_audio is not None else None
        self.emit(AudioChunk(msg.request_id, self.audio_index, msg.pcm, sample_rate, breakdown))
        self.audio_index += 1
        self.audio_s += len(msg.pcm) / sample_rate
        return first

    def _first_audio(self, times: FirstAudioTimes) -> FirstAudio:
        """The stages' share of the wait for the first audio (their clocks: this machine's)."""
        token_at = self.first_token_at if self.first_token_at is not None else times.talker_accepted_at
        arrived = self.first_audio_at if self.first_audio_at is not None else times.decoded_at
        return FirstAudio(
            to_first_token_ms=1e3 * (token_at - self.submitted_at),
            to_talker_ms=1e3 * (times.talker_accepted_at - token_at),
            talker_frames_ms=1e3 * (times.frames_made_at - times.talker_accepted_at),
            to_code2wav_ms=1e3 * (times.decode_started_at - times.frames_made_at),
            decode_ms=1e3 * (times.decoded_at - times.decode_started_at),
            to_engine_ms=1e3 * (arrived - times.decoded_at),
        )

    def slack(self, now: float) -> float | None:
        """Seconds of audio received ahead of real time since the first (a player started then has
        this much left); None before the first audio and once all of it has come."""
        if self.first_audio_at is None or self.audio is not None:
            return None
        return self.audio_s - (now - self.first_audio_at)

    def on_stage_finished(self, msg: StageFinished) -> FinishReason | None:
        """Record a stage's end of the request (not an error: the engine fails those); the request's
        finish reason once every stage it needs is done, else None."""
        if msg.stage == "thinker":
            self.thinker = msg
            tail = self.detok.flush()
            if self.parser is not None:
                self._emit_parsed((), self.parser.feed(tail) + self.parser.finish())
            elif tail:
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

    def finish(self, reason: FinishReason, error: str | None = None, out_of_memory: bool = False) -> None:
        """End the caller's iterator with `Finished` (once)."""
        self.done = True
        self.emit(Finished(self.request.request_id, reason, self.usage(), error, out_of_memory))

    def usage(self) -> Usage:
        t = self.thinker
        return Usage(
            prompt_tokens=t.prompt_tokens if t else len(self.request.prompt.input_ids),
            completion_tokens=t.count if t else self.detok.count,
            audio_frames=self.audio.count if self.audio else 0,
            cached_tokens=t.cached_tokens if t else 0,
        )
