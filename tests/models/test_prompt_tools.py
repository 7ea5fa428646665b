"""Prompts with functions, tool calls and tool results: `PromptBuilder` equals Qwen3-Omni's chat template
(transformers' `apply_chat_template(..., tools=...)`, audio placeholders expanded as the processor
expands them) token for token, on the tiny checkpoint's tokenizer and on the dummy's (the real ids)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from omnivoice.models.dummy import DummySource, dummy_spec
from omnivoice.models.dummy_tokenizer import load_dummy_processor_parts
from omnivoice.models.loader import ModelSpec, load_processor_parts
from omnivoice.models.prompt import PromptBuilder, PromptError
from omnivoice.types import AudioPart, ChatMessage, FunctionSpec, TextPart, ToolCall

WEATHER = FunctionSpec(
    "get_weather",
    "The weather in a city, now.",
    {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
     "required": ["city"]},
)  # fmt: skip
TIME = FunctionSpec("get_time", parameters={"type": "object", "properties": {}})
BARE = FunctionSpec("ping")


@pytest.fixture(scope="module", params=["tiny", "dummy"])
def builder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> PromptBuilder:
    if request.param == "tiny":
        path: Path = request.getfixturevalue("tiny_checkpoint")
        tokenizer, feature_extractor = load_processor_parts(path)
        spec = ModelSpec.from_pretrained(path)
    else:
        tokenizer, feature_extractor = load_dummy_processor_parts(tmp_path_factory.mktemp("omnivoice-cache"))
        spec = dummy_spec(DummySource("qwen3-omni-30b-a3b"))
    return PromptBuilder(tokenizer, feature_extractor, spec)


def noise(seconds: float, seed: int = 0) -> np.ndarray:
    return (0.1 * np.random.default_rng(seed).standard_normal(int(seconds * 16000))).astype(np.float32)


def template_message(m: ChatMessage) -> dict[str, Any]:
    """A message as a client hands it to the template: text-only content as one string, content with
    audio as a list of parts; calls and results in OpenAI's shape."""
    if any(isinstance(p, AudioPart) for p in m.parts):
        audio = {"type": "audio", "audio": "x.wav"}
        content: Any = [{"type": "text", "text": p.text} if isinstance(p, TextPart) else audio
                        for p in m.parts]  # fmt: skip
    else:
        content = "".join(p.text for p in m.parts if isinstance(p, TextPart))
    out: dict[str, Any] = {"role": m.role, "content": content}
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out


def template_ids(builder: PromptBuilder, messages: list[ChatMessage], tools: list[FunctionSpec]) -> list[int]:
    """What transformers' template and processor make of `messages`: the rendered text, each audio's
    one placeholder expanded to its token count, tokenized."""
    tokenizer, spec = builder._tokenizer, builder._spec
    openai_tools = [{"type": "function", "function": json.loads(_function_json(t))} for t in tools]
    text = tokenizer.apply_chat_template(
        [template_message(m) for m in messages], tools=openai_tools or None, tokenize=False,
        add_generation_prompt=True,
    )  # fmt: skip
    mels = builder.build(messages, tools=tools).audio_features
    counts = [spec.audio_token_count(mel.shape[1]) for mel in mels]
    pieces = text.split(tokenizer.audio_token)
    runs = zip(counts, pieces[1:], strict=True)
    expanded = pieces[0] + "".join(tokenizer.audio_token * n + rest for n, rest in runs)
    return tokenizer.encode(expanded, add_special_tokens=False)


def _function_json(t: FunctionSpec) -> str:
    f: dict[str, Any] = {"name": t.name}
    if t.description is not None:
        f["description"] = t.description
    if t.parameters is not None:
        f["parameters"] = t.parameters
    return json.dumps(f)


def call(id_: str, name: str, arguments: dict[str, Any]) -> ToolCall:
    return ToolCall(id_, name, json.dumps(arguments))


SYSTEM = ChatMessage("system", (TextPart("You are a helpful voice assistant."),))
ASK = ChatMessage("user", (TextPart("What's the weather in Paris and in Oslo, and the time?"),))
CONVERSATIONS = {
    "tools, no system": [ASK],
    "tools and a system turn": [SYSTEM, ASK],
    "a round trip": [
        SYSTEM,
        ASK,
        ChatMessage("assistant", (), tool_calls=(call("c1", "get_weather", {"city": "Paris"}),)),
        ChatMessage("tool", (TextPart('{"temp": 21, "sky": "sunny"}'),), tool_call_id="c1"),
    ],
    "parallel calls with text, results together": [
        SYSTEM,
        ASK,
        ChatMessage(
            "assistant",
            (TextPart("Let me check."),),
            tool_calls=(
                call("c1", "get_weather", {"city": "Paris", "unit": "C"}),
                call("c2", "get_weather", {"city": "Oslo"}),
                call("c3", "get_time", {}),
            ),
        ),
        ChatMessage("tool", (TextPart("21 C, sunny"),), tool_call_id="c1"),
        ChatMessage("tool", (TextPart("4 C, snow"),), tool_call_id="c2"),
        ChatMessage("tool", (TextPart("12:30"),), tool_call_id="c3"),
        ChatMessage("assistant", (TextPart("Paris is sunny, Oslo snowy; it is half past twelve."),)),
        ChatMessage("user", (TextPart("Thanks! And Rome?"),)),
    ],
    "a final assistant turn after the query (a reasoning block)": [
        ASK,
        ChatMessage("assistant", (TextPart("It is"),)),
    ],
    "reasoning in an assistant text": [
        ASK,
        ChatMessage("assistant", (TextPart("<think>\nhm\n</think>\n\nSunny."),)),
        ChatMessage("user", (TextPart("ok"),)),
    ],
    "a user turn that is a wrapped tool response is no query": [
        ASK,
        ChatMessage("assistant", (TextPart("One moment."),)),
        ChatMessage("user", (TextPart("<tool_response>\n21 C\n</tool_response>"),)),
        ChatMessage("assistant", (TextPart("Sunny."),)),
    ],
    "a system turn later on": [ASK, ChatMessage("system", (TextPart("Be brief."),)), ASK],
}


@pytest.mark.parametrize("name", list(CONVERSATIONS))
@pytest.mark.parametrize("tools", [[WEATHER, TIME, BARE], []], ids=["tools", "no-tools"])
def test_text_prompts_equal_the_chat_template(builder: PromptBuilder, name: str, tools) -> None:
    messages = CONVERSATIONS[name]
    assert list(builder.build(messages, tools=tools).input_ids) == template_ids(builder, messages, tools)


def test_audio_turns_equal_the_template_and_processor(builder: PromptBuilder) -> None:
    spoken = ChatMessage("user", (AudioPart(noise(1.2), 16000), TextPart("and in Oslo?")))
    messages = [
        SYSTEM,
        ChatMessage("user", (TextPart("Weather in Paris?"), AudioPart(noise(0.8, 1), 16000))),
        ChatMessage("assistant", (), tool_calls=(call("c1", "get_weather", {"city": "Paris"}),)),
        ChatMessage("tool", (TextPart("21 C"),), tool_call_id="c1"),
        ChatMessage("assistant", (TextPart("Sunny, 21 degrees."),)),
        spoken,
        ChatMessage("assistant", (TextPart("Let me see."),)),  # after the last query: audio is no query
    ]
    prompt = builder.build(messages, tools=[WEATHER])
    assert len(prompt.audio_features) == 2
    assert list(prompt.input_ids) == template_ids(builder, messages, [WEATHER])


def test_the_tools_section_and_a_call_read_as_the_template_writes_them(builder: PromptBuilder) -> None:
    tokenizer = builder._tokenizer
    messages = [ASK, ChatMessage("assistant", (), tool_calls=(call("c1", "get_time", {}),))]
    text = tokenizer.decode(builder.build(messages, tools=[TIME], default_system="Be brief.").input_ids)
    assert (
        text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions")
        and '\n<tools>\n{"type": "function", "function": {"name": "get_time", "parameters": ' in text
    )
    assert text.endswith(
        '<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n{"name": "get_time", "arguments": {}}\n'
        "</tool_call><|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (ChatMessage("assistant", ()), "no content"),
        (ChatMessage("user", (TextPart("x"),), tool_calls=(ToolCall("c", "f", "{}"),)), "only assistant"),
        (ChatMessage("tool", (AudioPart(noise(0.5), 16000),), tool_call_id="c"), "only accepted in user"),
        (ChatMessage("assistant", (), tool_calls=(ToolCall("c", "f", '{"a": "\ud800"}'),)), "Unicode"),
    ],
)
def test_invalid_tool_turns_are_prompt_errors(builder: PromptBuilder, message: ChatMessage, error: str):
    with pytest.raises(PromptError, match=error):
        builder.build([ASK, message])


def test_parameters_that_are_not_json_are_a_prompt_error(builder: PromptBuilder) -> None:
    with pytest.raises(PromptError, match="not JSON"):
        builder.build([ASK], tools=[FunctionSpec("f", parameters={"x": object()})])
