"""The thinker prompt of a response: the conversation history, and the functions it offers the model,
oldest items dropped until it fits."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from omnivoice.engine.api import EngineAPI
from omnivoice.server.session.conversation import Conversation
from omnivoice.types import ChatMessage, FunctionSpec, Prompt, TextPart, text_exceeds


async def build_prompt(
    engine: EngineAPI,
    conversation: Conversation,
    instructions: str | None,
    tools: Sequence[FunctionSpec] = (),
) -> tuple[Prompt, list[ChatMessage]] | str:
    """The prompt and the messages it holds, or a user-facing reason why there is none.

    Audio feature extraction is CPU work, so prompts are built in a worker thread. When the history
    is longer than the thinker's context, the oldest items are left out ("truncation": "auto"):
    first, without tokenizing, those whose text alone could not fit (`text_exceeds`).
    """
    limit, max_chars = engine.info.max_prompt_tokens, engine.info.max_prompt_chars
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
