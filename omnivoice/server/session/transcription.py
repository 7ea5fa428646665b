"""Transcripts of the caller: each committed user audio item, transcribed by the served model itself.

With `audio.input.transcription` set, every audio item the input buffer commits (server VAD or the
client's commit) gets a text-only thinker pass of its own: the audio and an instruction to write it
down, greedy, at most `realtime.transcription_max_tokens` tokens, no audio (the talker never sees
it). It runs beside the session's response, never before it, and streams
`conversation.item.input_audio_transcription.delta` events, then `.completed` with the whole
transcript (the deltas joined), or `.failed` with the reason. The transcript is kept on the item's
content (`conversation.item.retrieve` shows it); later prompts still hear the audio itself.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import aclosing
from typing import Any

from omnivoice.engine.api import EngineAPI
from omnivoice.server.session.conversation import INPUT_RATE, Item, new_id
from omnivoice.server.session.outbox import Outbox
from omnivoice.server.session.prompting import featurize
from omnivoice.server.session.session_config import Transcription
from omnivoice.types import (
    AudioPart,
    ChatMessage,
    EngineOverloaded,
    Finished,
    GenerationRequest,
    Sampling,
    TextDelta,
    TextPart,
    Usage,
)

log = logging.getLogger(__name__)

DELTA = "conversation.item.input_audio_transcription.delta"
COMPLETED = "conversation.item.input_audio_transcription.completed"
FAILED = "conversation.item.input_audio_transcription.failed"


class TranscriptionFailed(Exception):
    """A transcription that could not run or finish; `code` goes to the client with the message."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


def instruction(t: Transcription) -> str:
    """The text that asks the model for a verbatim transcript, with the client's hints."""
    lines = ["Transcribe the audio into text, word for word. Reply with the transcript only."]
    languages = [*([t.language] if t.language else []), *t.languages]
    if languages:
        lines.append(f"Language of the audio (ISO-639-1): {', '.join(languages)}.")
    if t.keywords:
        lines.append(f"Words it may contain: {', '.join(t.keywords)}.")
    if t.prompt:
        lines.append(f"Context: {t.prompt}")
    return "\n".join(lines)


def transcription_messages(item: Item, content_index: int, t: Transcription) -> list[ChatMessage]:
    """The one user turn that asks for the transcript of the item's audio part `content_index` (with
    its features, once computed)."""
    content = item.content[content_index]
    assert content.audio is not None
    audio = AudioPart(content.audio, INPUT_RATE, content.features)
    return [ChatMessage("user", (audio, TextPart(instruction(t))))]


def usage_object(usage: Usage) -> dict[str, Any]:
    """The `usage` of a completed event: the thinker's tokens (OpenAI's `tokens` shape)."""
    return {
        "type": "tokens",
        "input_tokens": usage.prompt_tokens,
        "output_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


class Transcriber:
    """A session's transcriptions in flight, one task each; `close` aborts them all in the engine."""

    def __init__(
        self,
        session_id: str,
        engine: EngineAPI,
        outbox: Outbox,
        max_tokens: int,
        featurizing: asyncio.Lock | None = None,
    ) -> None:
        self._session_id = session_id
        self._engine = engine
        self._outbox = outbox
        # the conversation's lock: its prompts and the transcription featurize the item's audio once
        self._featurizing = featurizing or asyncio.Lock()
        self._sampling = Sampling(temperature=0.0, max_tokens=max_tokens)  # greedy: the likeliest words
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def start(self, item: Item, t: Transcription, content_index: int = 0) -> None:
        """Transcribe the item's audio part `content_index` in the background."""
        task = asyncio.create_task(self._run(item, content_index, t), name=f"transcribe-{item.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, item: Item, content_index: int, t: Transcription) -> None:
        where = {"item_id": item.id, "content_index": content_index}
        try:
            text, usage = await self._transcribe(item, content_index, t, where)
        except TranscriptionFailed as e:
            log.info("session %s: transcription of %s failed: %s", self._session_id, item.id, e)
            self._failed(where, str(e), e.code)
            return
        except Exception as e:
            log.exception("session %s: transcription of %s failed", self._session_id, item.id)
            self._failed(where, f"the transcription failed: {type(e).__name__}", "internal_error")
            return
        item.content[content_index].transcript = text
        self._outbox.put({"type": COMPLETED, **where, "transcript": text, "usage": usage_object(usage)})

    async def _transcribe(
        self, item: Item, content_index: int, t: Transcription, where: dict[str, Any]
    ) -> tuple[str, Usage]:
        """The transcript and its usage; its deltas go out as they come."""
        await featurize(self._engine.log_mel, [item], self._featurizing)  # kept with the item
        messages = transcription_messages(item, content_index, t)
        try:  # tokenizing is CPU work: off the event loop
            prompt = await asyncio.to_thread(self._engine.build_prompt, messages)
        except ValueError as e:
            raise TranscriptionFailed(str(e), "invalid_value") from None
        limit = self._engine.info.max_prompt_tokens
        if len(prompt.input_ids) > limit:
            message = f"the audio is longer than the model's context ({limit} tokens) can transcribe"
            raise TranscriptionFailed(message, "context_length_exceeded")
        request = GenerationRequest(
            new_id("transcribe"), prompt, want_audio=False, thinker=self._sampling, cache_key=None
        )
        why = self._engine.overloaded(request)
        if why is not None:
            raise TranscriptionFailed(why, "server_overloaded")
        pieces: list[str] = []
        try:
            async with aclosing(self._engine.generate(request)) as outputs:  # leaving early aborts it
                async for out in outputs:
                    if isinstance(out, TextDelta) and out.text:
                        pieces.append(out.text)
                        self._outbox.put({"type": DELTA, **where, "delta": out.text})
                    elif isinstance(out, Finished):
                        if out.finish_reason not in ("stop", "length"):
                            raise TranscriptionFailed(out.error or "generation failed", "engine_error")
                        return "".join(pieces), out.usage
        except EngineOverloaded as e:
            raise TranscriptionFailed(str(e), "server_overloaded") from None
        raise TranscriptionFailed("the engine's output ended early", "engine_error")

    def _failed(self, where: dict[str, Any], message: str, code: str) -> None:
        body = {"type": "server_error", "code": code, "message": message, "param": None}
        self._outbox.put({"type": FAILED, **where, "error": body})

    async def close(self) -> None:
        """Abort every transcription in flight (in every engine stage) and wait for them."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
