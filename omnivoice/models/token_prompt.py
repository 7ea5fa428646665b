"""Chat prompts made of token ids directly, for loads that need no text: benchmarks and warm-ups.

Requests carry token ids, so no text is encoded; a checkpoint's tokenizer is asked only for the
newline id of the chat layout (a dummy model's is known without one).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from omnivoice.models.loader import ModelSpec
from omnivoice.types import Prompt

CHAT_LAYOUT_IDS = 8  # the ids `chat_prompt` puts around the body


def chat_prompt(spec: ModelSpec, body: list[int], newline_id: int) -> Prompt:
    """`<|im_start|>user\\n{body}<|im_end|>\\n<|im_start|>assistant\\n` as token ids."""
    head = [spec.im_start_id, spec.user_id, newline_id]
    tail = [spec.im_end_id, newline_id, spec.im_start_id, spec.assistant_id, newline_id]
    return Prompt(input_ids=tuple(head + body + tail))


def text_ids(spec: ModelSpec, n: int, rng: np.random.Generator) -> list[int]:
    """n random plain-text ids: everything below the first special token (<|endoftext|> / <|im_start|>)."""
    return rng.integers(0, min(spec.im_start_id, *spec.thinker_eos_ids), size=n).tolist()


def newline_id(tokenizer: Any) -> int:
    """The id of "\\n" in `tokenizer` (None: a dummy model's)."""
    if tokenizer is None:
        from omnivoice.models.dummy import NEWLINE_ID

        return NEWLINE_ID
    ids = tokenizer.encode("\n", add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(f"the tokenizer encodes a newline as {ids}, not one token")
    return int(ids[0])
