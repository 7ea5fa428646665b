"""Realtime function calling over a real server and the fake engine, driven by the `openai` SDK: the
session's tools reach the prompt and the engine, each call streams as a `function_call` output item in
the GA order, the client's `function_call_output` and `response.create` continue the turn with the
result in the prompt; `tool_choice: none` offers nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from omnivoice.types import ChatMessage, TextPart, ToolCall
from tests.support.fake_engine import FakeServer, Script, serve_realtime
from tests.support.realtime_client import Recorder, client

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
ARGS = '{"city": "Oslo"}'
ASK = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Oslo?"}]}


@pytest.fixture(scope="module")
def srv() -> Iterator[FakeServer]:
    with serve_realtime(Script(texts=(), audio_chunks=0, tool_calls=(("get_weather", ARGS),))) as s:
        yield s


def of_response(rec: Recorder, response_id: str) -> list[Any]:
    return [e for _, e in rec.events if getattr(e, "response_id", None) == response_id]


async def test_a_call_streams_as_an_item_and_its_output_continues_the_turn(srv: FakeServer) -> None:
    async with client(srv.url).realtime.connect(model="omnivoice") as conn:
        rec = Recorder(conn)
        await rec.next("session.created")
        await conn.session.update(session={"type": "realtime", "tools": [WEATHER], "tool_choice": "required"})
        updated = (await rec.next("session.updated")).session
        await conn.conversation.item.create(item=ASK)  # type: ignore[arg-type]
        await conn.response.create()
        first = (await rec.next("response.done")).response
        events = of_response(rec, first.id)
        call = first.output[0]
        await conn.conversation.item.create(
            item={"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}
        )
        await conn.response.create()
        second = (await rec.next("response.done")).response
        await rec.close()
    assert updated.tools[0].name == "get_weather" and updated.tool_choice == "required"
    request = srv.engine.requests[-2]
    assert request.tools is not None and request.tools.choice == "required"
    assert [f.name for f in request.tools.functions] == ["get_weather"]
    assert [f.name for f in srv.engine.tools[-2]] == ["get_weather"]  # offered in the prompt
    # the call, in the GA order; a response that is only a call has no message and no audio
    assert [e.type for e in events] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    added, *deltas, done, item_done = events
    assert (
        added.item.type == "function_call" and added.item.arguments == "" and added.item.name == "get_weather"
    )
    assert {d.item_id for d in deltas} == {added.item.id} and "".join(d.delta for d in deltas) == ARGS
    assert all(d.call_id == added.item.call_id and d.output_index == 0 for d in deltas)
    assert done.name == "get_weather" and json.loads(done.arguments) == {"city": "Oslo"}
    assert item_done.item.status == "completed" and item_done.item.arguments == ARGS
    assert first.status == "completed" and len(first.output) == 1
    assert call.type == "function_call" and call.arguments == ARGS
    # the result continues the turn: the prompt holds the call and its output
    assert second.status == "completed"
    messages = srv.engine.prompts[-1]
    assert messages[-2] == ChatMessage(
        "assistant", (), tool_calls=(ToolCall(call.call_id, "get_weather", ARGS),)
    )
    assert messages[-1] == ChatMessage("tool", (TextPart("sunny, 21 C"),), tool_call_id=call.call_id)


async def test_text_then_a_call_and_tool_choice_none(srv: FakeServer) -> None:
    srv.engine.script = Script(
        texts=("Let me", " check."), audio_chunks=1, tool_calls=(("get_weather", ARGS),)
    )
    try:
        async with client(srv.url).realtime.connect(model="omnivoice") as conn:
            rec = Recorder(conn)
            await rec.next("session.created")
            await conn.session.update(session={"type": "realtime", "tools": [WEATHER]})
            await conn.conversation.item.create(item=ASK)  # type: ignore[arg-type]
            await conn.response.create()
            both = (await rec.next("response.done")).response
            await conn.response.create(response={"tool_choice": "none"})
            plain = (await rec.next("response.done")).response
            await rec.close()
    finally:
        srv.engine.script = Script(texts=(), audio_chunks=0, tool_calls=(("get_weather", ARGS),))
    assert [i.type for i in both.output] == ["message", "function_call"]
    assert both.output[0].content[0].transcript == "Let me check."
    call_events = [e for e in of_response(rec, both.id) if e.type.startswith("response.function_call")]
    assert {e.output_index for e in call_events} == {1}
    # tool_choice none: no function offered, in the prompt or to the engine; no call
    assert srv.engine.requests[-1].tools is None and srv.engine.tools[-1] == ()
    assert [i.type for i in plain.output] == ["message"]


async def test_a_required_call_whose_schema_cannot_be_enforced_is_refused(srv: FakeServer) -> None:
    town = {"type": "function", "name": "f", "parameters": {"properties": {"x": {"type": "town"}}}}
    async with client(srv.url).realtime.connect(model="omnivoice") as conn:
        rec = Recorder(conn)
        await rec.next("session.created")
        await conn.session.update(session={"type": "realtime", "tools": [town], "tool_choice": "required"})
        refused = (await rec.next("error")).error
        await conn.session.update(session={"type": "realtime", "tools": [town]})  # auto: nothing to enforce
        kept = (await rec.next("session.updated")).session
        await conn.conversation.item.create(item=ASK)  # type: ignore[arg-type]
        await conn.response.create(response={"tool_choice": "required"})
        refused_response = (await rec.next("error")).error
        await rec.close()
    assert refused.param == "session.tools" and refused.code == "invalid_schema" and "town" in refused.message
    assert kept.tools[0].name == "f" and kept.tool_choice == "auto"
    assert refused_response.param == "response.tools" and "response.created" not in rec.types()


async def test_a_call_cut_short_ends_incomplete_with_what_was_written(srv: FakeServer) -> None:
    srv.engine.script = Script(texts=(), audio_chunks=0, tool_calls=(("get_weather", ARGS),), delay=0.5)
    try:
        async with client(srv.url).realtime.connect(model="omnivoice") as conn:
            rec = Recorder(conn)
            await rec.next("session.created")
            await conn.session.update(session={"type": "realtime", "tools": [WEATHER]})
            await conn.conversation.item.create(item=ASK)  # type: ignore[arg-type]
            await conn.response.create()
            await rec.next("response.function_call_arguments.delta")  # half the arguments
            await conn.response.cancel()
            done = (await rec.next("response.done")).response
            await rec.close()
    finally:
        srv.engine.script = Script(texts=(), audio_chunks=0, tool_calls=(("get_weather", ARGS),))
    cut = next(e for e in of_response(rec, done.id) if e.type == "response.function_call_arguments.done")
    assert done.status == "cancelled" and done.output[0].status == "incomplete"
    assert cut.arguments == done.output[0].arguments == ARGS[: len(ARGS) // 2]
    assert of_response(rec, done.id)[-1].type == "response.output_item.done"
