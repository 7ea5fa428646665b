"""The realtime prompt of a long conversation is fitted with a logarithmic number of tokenizations
(the tiny checkpoint's real tokenizer and prompt builder), and keeps the newest items that fit."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from omnivoice.config import parse_profile
from omnivoice.engine.loading import ServedModel, load_served_model, model_info
from omnivoice.server.session.conversation import Content, Conversation, Item
from omnivoice.server.session.prompting import fit_prompt
from omnivoice.types import ChatMessage, FunctionSpec, ModelInfo, Prompt, TextPart


class CountingBuilder:
    """The engine's prompt side (`info`, `build_prompt`) over the tiny model's builder, counting builds."""

    def __init__(self, model: ServedModel, info: ModelInfo) -> None:
        self._model, self.info, self.builds = model, info, 0

    def build_prompt(self, messages: Sequence[ChatMessage], tools: Sequence[FunctionSpec] = ()) -> Prompt:
        self.builds += 1
        return self._model.builder.build(messages, None, tools, self.info.max_prompt_tokens)


@pytest.fixture(scope="module")
def engine(tiny_checkpoint: Path) -> CountingBuilder:
    stage = {"max_seq_len": 512}
    profile = parse_profile(
        {"model": {"path": str(tiny_checkpoint)}, "stages": {"thinker": stage, "talker": stage}}
    )
    model = load_served_model(profile)
    return CountingBuilder(model, model_info(profile, model.spec, model.builder))


def conversation(count: int, words: int = 12) -> Conversation:
    c = Conversation()
    for n in range(count):
        text = f"item {n}: " + "the quick brown fox " * (words // 4)
        c.items.append(Item(f"item_{n}", "user", [Content("input_text", text=text)]))
    return c


@pytest.mark.parametrize("count", [10, 200, 2000])
def test_a_long_conversation_is_fitted_in_few_tokenizations(engine: CountingBuilder, count: int) -> None:
    engine.builds = 0
    built = fit_prompt(engine, conversation(count), "be brief", ())  # type: ignore[arg-type]
    assert not isinstance(built, str), built
    prompt, messages = built
    assert len(prompt.input_ids) <= engine.info.max_prompt_tokens
    # the newest items, in order, behind the instructions
    texts = [p.text for m in messages[1:] for p in m.parts if isinstance(p, TextPart)]
    assert texts[-1].startswith(f"item {count - 1}:") and messages[0].role == "system"
    numbers = [int(t.split(":")[0].split()[1]) for t in texts]
    assert numbers == list(range(numbers[0], count))
    # and no older one fits next to them
    longer = Conversation()
    longer.items = conversation(count).items[numbers[0] - 1 :] if numbers[0] else []
    if longer.items:
        bigger = engine.build_prompt(longer.messages("be brief"))
        assert len(bigger.input_ids) > engine.info.max_prompt_tokens
    assert engine.builds <= 2 * count.bit_length() + 3, engine.builds


def test_an_item_too_long_alone_is_said_so(engine: CountingBuilder) -> None:
    c = conversation(3, words=4000)
    assert fit_prompt(engine, c, None, ()).startswith("the latest conversation item alone")  # type: ignore[arg-type,union-attr]
