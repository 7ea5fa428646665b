"""Function calling in `/v1/chat/completions` over a real server and the fake engine, driven by the
`openai` SDK: what reaches the engine (functions, choice, the history's tool turns), the response
shapes of calls (streamed and not), and the 400s of tools that cannot be offered as asked."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from omnivoice.types import ChatMessage, FunctionSpec, TextPart, ToolCall, Tools
from tests.support.fake_engine import FakeServer, Script, serve_fake

USER = [{"role": "user", "content": "What's the weather in Paris?"}]
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Now.", "parameters": PARAMETERS},
}
TIME = {"type": "function", "function": {"name": "get_time"}}
CALLS = (("get_weather", '{"city": "Paris"}'), ("get_time", "{}"))
OFFERED = (FunctionSpec("get_weather", "Now.", PARAMETERS), FunctionSpec("get_time"))


@pytest.fixture(scope="module")
def srv() -> Iterator[FakeServer]:
    """Its requests say a word, then call both functions when offered any; no audio."""
    with serve_fake(Script(texts=("Checking.",), audio_chunks=0, tool_calls=CALLS)) as s:
        yield s


@pytest.fixture(scope="module")
def sdk(srv: FakeServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0)


def create(sdk: openai.OpenAI, **kw: Any) -> Any:
    return sdk.chat.completions.create(model="omnivoice", **{"messages": USER, **kw})


@pytest.mark.parametrize(
    ("extra", "tools"),
    [
        ({}, Tools(OFFERED)),
        ({"tool_choice": "required", "parallel_tool_calls": False}, Tools(OFFERED, "required", None, False)),
        ({"tool_choice": {"type": "function", "function": {"name": "get_time"}}},
         Tools(OFFERED, "required", "get_time")),
    ],
)  # fmt: skip
def test_the_engine_is_offered_the_functions_as_chosen(srv: FakeServer, sdk, extra: dict, tools) -> None:
    create(sdk, tools=[WEATHER, TIME], **extra)
    assert srv.engine.requests[-1].tools == tools
    assert srv.engine.tools[-1] == OFFERED  # rendered into the prompt


def test_tool_choice_none_offers_no_function(srv: FakeServer, sdk: openai.OpenAI) -> None:
    done = create(sdk, tools=[WEATHER], tool_choice="none")
    assert srv.engine.requests[-1].tools is None and srv.engine.tools[-1] == ()
    assert done.choices[0].message.tool_calls is None and done.choices[0].finish_reason == "stop"


def test_calls_in_one_response(sdk: openai.OpenAI) -> None:
    choice = create(sdk, tools=[WEATHER, TIME], modalities=["text"]).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
    calls = choice.message.tool_calls
    assert [(c.type, c.function.name, c.function.arguments) for c in calls] == [
        ("function", *c) for c in CALLS
    ]
    assert len({c.id for c in calls}) == 2


def test_streamed_calls_assemble_to_the_same(sdk: openai.OpenAI) -> None:
    text, calls, reasons = "", {}, []
    for chunk in create(sdk, tools=[WEATHER, TIME], modalities=["text"], stream=True):
        delta = chunk.choices[0].delta
        text += delta.content or ""
        for c in delta.tool_calls or []:
            if c.id is not None:  # a call's first chunk: its id, type and name
                assert c.type == "function" and c.function.arguments == ""
                calls[c.index] = [c.id, c.function.name, ""]
            else:
                assert c.function.name is None
                calls[c.index][2] += c.function.arguments
        reasons.append(chunk.choices[0].finish_reason)
    assert text == "Checking." and [(n, a) for _, n, a in calls.values()] == list(CALLS)
    assert reasons[-1] == "tool_calls" and set(reasons[:-1]) == {None}


def test_a_response_of_calls_only_has_no_content_and_no_audio() -> None:
    with serve_fake(Script(texts=(), audio_chunks=0, tool_calls=CALLS[:1])) as s:
        sdk = openai.OpenAI(base_url=f"{s.url}/v1", api_key="unused", max_retries=0)
        done = create(
            sdk, tools=[WEATHER], modalities=["text", "audio"], audio={"voice": "ethan", "format": "wav"}
        )
    (choice,) = done.choices  # no second choice for audio: there is none
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None and choice.message.audio is None
    assert choice.message.tool_calls[0].function.arguments == CALLS[0][1]


def test_a_history_with_calls_and_results_reaches_the_prompt(srv: FakeServer, sdk: openai.OpenAI) -> None:
    function = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    call = {"id": "call_1", "type": "function", "function": function}
    history = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "21 C, sunny"}]},
    ]  # fmt: skip
    assert create(sdk, messages=history, tools=[WEATHER]).choices[0].message.tool_calls
    assert srv.engine.prompts[-1][1:] == (
        ChatMessage("assistant", (), tool_calls=(ToolCall("call_1", "get_weather", '{"city": "Paris"}'),)),
        ChatMessage("tool", (TextPart("21 C, sunny"),), tool_call_id="call_1"),
    )


CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
ANSWERED = [*USER, {"role": "assistant", "tool_calls": [CALL]}]
BAD_ARGUMENTS = {"name": "f", "arguments": "{"}


@pytest.mark.parametrize(
    ("body", "param", "needle"),
    [
        ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name", "second function"),
        ({"tools": [{"type": "function", "function": {"name": "get weather"}}]},
         "tools[0].function.name", "pattern"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
         "tools[0].function.parameters", "object"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type", "function"),
        ({"tool_choice": "required"}, "tool_choice", "no tools"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "f"}}},
         "tool_choice.function.name", "'f'"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", "sometimes"),
        ({"messages": [*ANSWERED, {"role": "tool", "content": "1"}]}, "messages[2].tool_call_id", "needs"),
        ({"messages": [*ANSWERED, {"role": "tool", "content": "1", "tool_call_id": "c2"}]},
         "messages[2].tool_call_id", "'c2'"),
        ({"messages": [*ANSWERED, {"role": "tool", "tool_call_id": "c1"}]},
         "messages[2].content", "required"),
        ({"messages": [*USER, {"role": "assistant", "tool_calls": [{**CALL, "function": BAD_ARGUMENTS}]}]},
         "messages[1].tool_calls[0].function.arguments", "JSON"),
        ({"messages": [{"role": "user", "content": "x", "tool_calls": [CALL]}]},
         "messages[0].tool_calls", "assistant"),
        ({"messages": [*USER, {"role": "function", "name": "f", "content": "1"}]}, "messages[1]", "'tool'"),
    ],
)  # fmt: skip
def test_tools_that_cannot_be_offered_are_refused(
    srv: FakeServer, body: dict, param: str, needle: str
) -> None:
    r = httpx.post(f"{srv.url}/v1/chat/completions", json={"messages": USER, **body}, timeout=10)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and needle in error["message"], error
    assert error["type"] == "invalid_request_error"


def test_a_required_call_with_a_schema_that_cannot_be_enforced_is_refused(srv: FakeServer) -> None:
    town = {
        "type": "function",
        "function": {"name": "f", "parameters": {"properties": {"x": {"type": "town"}}}},
    }
    body = {"messages": USER, "tools": [town], "tool_choice": "required"}
    r = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text
    assert r.json()["error"]["code"] == "invalid_schema" and "town" in r.json()["error"]["message"]
