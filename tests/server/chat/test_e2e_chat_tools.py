"""End to end: function calling through the real engine (the tiny model, whose chat template is the real
one) behind a real server, driven by the `openai` SDK. `tool_choice` holds even the random model to a
call of valid JSON of the function's schema; the talker never speaks it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import openai
import pytest
from pydantic import BaseModel, Field

from tests.support.serve import serve_tiny

pytestmark = pytest.mark.slow

USER: list[Any] = [{"role": "user", "content": "What is the weather like today in the city?"}]


class Weather(BaseModel):
    """A function's arguments, bounded so that even the random model's JSON ends."""

    city: str = Field(max_length=12)
    unit: Literal["celsius", "fahrenheit"]
    days: int = Field(ge=1, le=14)


class Timer(BaseModel):
    minutes: int = Field(ge=1, le=60)


def tool(name: str, model: type[BaseModel]) -> dict[str, Any]:
    schema = {**model.model_json_schema(), "additionalProperties": False}
    return {"type": "function", "function": {"name": name, "description": name, "parameters": schema}}


TOOLS = [tool("get_weather", Weather), tool("set_timer", Timer)]
SCHEMAS = {"get_weather": Weather, "set_timer": Timer}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
AUDIO = {"modalities": ["text", "audio"], "audio": {"voice": "ethan", "format": "wav"}}


@pytest.fixture(scope="module")
def client(tiny_checkpoint: Path) -> Iterator[openai.OpenAI]:
    with serve_tiny(tiny_checkpoint) as st:
        yield openai.OpenAI(base_url=f"{st.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def create(client: openai.OpenAI, min_tokens: int = 0, **kw: Any) -> Any:
    body = {"model": "omnivoice", "messages": USER, "tools": TOOLS, "max_tokens": 120, "temperature": 1.0}
    # the random talker rarely ends its speech by itself: a few seconds of it at most
    extra = {"max_audio_frames": 50, "min_tokens": min_tokens}
    return client.chat.completions.create(**{**body, **kw}, extra_body=extra)


def test_a_named_choice_makes_a_call_of_that_functions_schema_and_no_audio(client: openai.OpenAI) -> None:
    done = create(client, tool_choice=NAMED, seed=3, **AUDIO)
    (choice,) = done.choices  # no audio choice: a response that is only a call is not spoken
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None and choice.message.audio is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    Weather.model_validate_json(call.function.arguments)  # valid JSON of the schema
    assert done.usage.completion_tokens_details.audio_tokens == 0


def test_streamed_deltas_assemble_to_the_same_call(client: openai.OpenAI) -> None:
    whole = create(client, tool_choice=NAMED, seed=4, modalities=["text"]).choices[0].message.tool_calls[0]
    calls: dict[int, list[str]] = {}
    reasons, texts = [], ""
    for chunk in create(client, tool_choice=NAMED, seed=4, modalities=["text"], stream=True):
        delta = chunk.choices[0].delta
        texts += delta.content or ""
        for c in delta.tool_calls or []:
            if c.id:
                calls[c.index] = [c.function.name, c.function.arguments]
            else:
                calls[c.index][1] += c.function.arguments
        reasons.append(chunk.choices[0].finish_reason)
    assert texts == "" and reasons[-1] == "tool_calls"
    assert calls == {0: [whole.function.name, whole.function.arguments]}


def test_required_calls_are_of_the_offered_functions(client: openai.OpenAI) -> None:
    for seed in (5, 6):
        calls = create(client, tool_choice="required", seed=seed, **AUDIO).choices[0].message.tool_calls
        assert calls
        for call in calls:
            SCHEMAS[call.function.name].model_validate_json(call.function.arguments)
    one = create(client, tool_choice="required", parallel_tool_calls=False, seed=7, modalities=["text"])
    assert len(one.choices[0].message.tool_calls) == 1


def test_a_history_with_a_tool_result_continues_the_turn(client: openai.OpenAI) -> None:
    call = create(client, tool_choice=NAMED, seed=8, modalities=["text"]).choices[0].message.tool_calls[0]
    history = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump(exclude_none=True)]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp": 21, "sky": "sunny"})},
    ]
    done = create(client, messages=history, tool_choice="none", max_tokens=8, min_tokens=8, **AUDIO)
    assert done.choices[0].finish_reason == "length" and done.choices[0].message.content
    assert done.choices[0].message.audio.data  # an answer is spoken again
