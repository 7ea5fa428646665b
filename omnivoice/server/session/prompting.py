"""The thinker prompt of a response: the conversation history, and the functions it offers the model,
oldest items dropped until it fits.

Each audio item's log-mel features are computed once and kept with it, so neither later turns nor
dropping items to fit featurize any audio again.
"""

from __future__ import annotations

import asyncio
import contextlib
import unicodedata
from collections.abc import Sequence

from omnivoice.audio.log_mel import LogMel
from omnivoice.engine.api import EngineAPI
from omnivoice.server.session.conversation import INPUT_RATE, Content, Conversation, Item
from omnivoice.types import ChatMessage, FunctionSpec, Prompt, PromptTooLong


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

    When the history is longer than the thinker's context, the oldest items are left out
    ("truncation": "auto"). Tokenizing is CPU work, so the prompt is fitted in a worker thread, on a
    snapshot of the items, in time linear in the conversation's length (`fit_prompt`).
    """
    await featurize(engine.log_mel, conversation.items, conversation.featurizing)
    return await asyncio.to_thread(fit_prompt, engine, conversation.snapshot(), instructions, tools)


def fit_prompt(
    engine: EngineAPI, conversation: Conversation, instructions: str | None, tools: Sequence[FunctionSpec]
) -> tuple[Prompt, list[ChatMessage]] | str:
    """The prompt of the newest items that fit the thinker's context, or why there is none.

    First, without tokenizing, the oldest items whose text could not fit next to the newer ones are
    left out (each item's characters counted once, `text_exceeds`' measure); then, if the prompt of
    the rest is still too long, the fewest further items to leave out are found by bisection (a
    prompt never grows as older items leave it), so the conversation is tokenized a logarithmic
    number of times, never once per item.
    """
    limit, max_chars = engine.info.max_prompt_tokens, engine.info.max_prompt_chars
    items = conversation.items
    if not conversation.messages(instructions, 0):
        return "the conversation is empty: add an item or set instructions first"
    first = _first_fitting_chars(items, instructions, tools, max_chars)
    tries: dict[int, tuple[Prompt, list[ChatMessage]] | str | None] = {}

    def attempt(skip: int) -> tuple[Prompt, list[ChatMessage]] | str | None:
        """The prompt without the `skip` oldest items; None when it is too long; a reason it fails."""
        if skip not in tries:
            tries[skip] = _try(engine, conversation, instructions, tools, skip, limit)
        return tries[skip]

    last = max(0, len(items) - 1)
    if first <= last:
        built = attempt(first)
        if built is not None:
            return built
        if attempt(last) is not None:
            low, high = first, last  # attempt(low) is too long, attempt(high) is not
            while high - low > 1:
                middle = (low + high) // 2
                low, high = (low, middle) if attempt(middle) is not None else (middle, high)
            return attempt(high) or "the prompt could not be built"
    if tools and isinstance(_try(engine, conversation, instructions, (), last, limit), tuple):
        return f"the functions offered (tools) leave no room in the model's context ({limit} tokens)"
    return f"the latest conversation item alone is longer than the model's context ({limit} tokens)"


def _first_fitting_chars(
    items: Sequence[Item], instructions: str | None, tools: Sequence[FunctionSpec], max_chars: int | None
) -> int:
    """The fewest oldest items to leave out so that the rest's text (with the instructions' and the
    functions') does not exceed `max_chars` characters; len(items) when not even the latest fits."""
    if max_chars is None:
        return 0
    fixed = [instructions or ""] + [f.name + (f.description or "") + str(f.parameters or "") for f in tools]
    room = max_chars - _chars(fixed)
    for skip in range(len(items) - 1, -1, -1):  # newest first: a running sum, each item counted once
        room -= _chars(_texts(items[skip]))
        if room < 0:
            return skip + 1
    return 0


def _texts(item: Item) -> list[str]:
    texts = [t for c in item.content for t in (c.text, c.transcript) if t]
    return [*texts, item.name or "", item.arguments, item.output]


def _chars(texts: Sequence[str]) -> int:
    """Characters as the tokenizer reads them (NFC), as `text_exceeds` counts them."""
    return sum(len(unicodedata.normalize("NFC", t)) for t in texts)


def _try(
    engine: EngineAPI,
    conversation: Conversation,
    instructions: str | None,
    tools: Sequence[FunctionSpec],
    skip: int,
    limit: int,
) -> tuple[Prompt, list[ChatMessage]] | str | None:
    messages = conversation.messages(instructions, skip)
    if not messages:
        return "the conversation is empty: add an item or set instructions first"
    try:
        prompt = engine.build_prompt(messages, tools)
    except PromptTooLong:
        return None
    except ValueError as e:  # the prompt builder's PromptError: a user-facing message
        return str(e)
    return (prompt, messages) if len(prompt.input_ids) <= limit else None
