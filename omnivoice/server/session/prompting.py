"""The thinker prompt of a response: the conversation history, and the functions it offers the model,
oldest items dropped until it fits.

Each audio item's log-mel features are computed once and kept with it, so neither later turns nor
dropping items to fit featurize any audio again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from omnivoice.audio.log_mel import LogMel
from omnivoice.engine.api import EngineAPI
from omnivoice.server.session.conversation import INPUT_RATE, Content, Conversation, Item
from omnivoice.types import ChatMessage, FunctionSpec, Prompt, TextPart, text_exceeds


async def featurize(log_mel: LogMel, items: Sequence[Item], lock: asyncio.Lock) -> None:
    """Compute the features of the items' audio that has none yet, in a worker thread (CPU work in
    proportion to the audio), under `lock` (their conversation's: a response, an early prefill and a
    transcription may build prompts of the same clip at once). A clip spoken under server VAD has
    most of its frames computed already: only its last ones remain. Audio that cannot be featurized
    keeps none; the prompt builder then says why."""
    if log_mel.sample_rate != INPUT_RATE or not _unfeaturized(items):
        return  # (a model of another rate: the prompt builder resamples and featurizes)
    async with lock:
        todo = _unfeaturized(items)
        if todo:
            await asyncio.to_thread(_featurize, log_mel, todo)


def _unfeaturized(items: Sequence[Item]) -> list[Content]:
    return [
        c for i in items for c in i.content if c.audio is not None and c.audio.size and c.features is None
    ]


def _featurize(log_mel: LogMel, contents: list[Content]) -> None:
    for c in contents:
        assert c.audio is not None
        stream, c.stream = c.stream, None
        if stream is not None:
            with contextlib.suppress(ValueError):  # (the clip is not what was streamed: featurize it whole)
                c.features = stream.finish(c.audio)
                continue
        with contextlib.suppress(ValueError):
            c.features = log_mel(c.audio)


async def build_prompt(
    engine: EngineAPI,
    conversation: Conversation,
    instructions: str | None,
    tools: Sequence[FunctionSpec] = (),
) -> tuple[Prompt, list[ChatMessage]] | str:
    """The prompt and the messages it holds, or a user-facing reason why there is none.

    Tokenizing is CPU work, so prompts are built in a worker thread. When the history
    is longer than the thinker's context, the oldest items are left out ("truncation": "auto"):
    first, without tokenizing, those whose text alone could not fit (`text_exceeds`).
    """
    limit, max_chars = engine.info.max_prompt_tokens, engine.info.max_prompt_chars
    await featurize(engine.log_mel, conversation.items, conversation.featurizing)
    for skip in range(max(1, len(conversation.items))):
        messages = conversation.messages(instructions, skip)
        if not messages:
            return "the conversation is empty: add an item or set instructions first"
        texts = [p.text for m in messages for p in m.parts if isinstance(p, TextPart)]
        texts += [c.name + c.arguments for m in messages for c in m.tool_calls]
        texts += [f.name + (f.description or "") + str(f.parameters or "") for f in tools]
        if text_exceeds(texts, max_chars):
            continue
        try:
            prompt = await asyncio.to_thread(engine.build_prompt, messages, tools)
        except ValueError as e:  # the prompt builder's PromptError: a user-facing message
            return str(e)
        if len(prompt.input_ids) <= limit:
            return prompt, messages
    return f"the latest conversation item alone is longer than the model's context ({limit} tokens)"
