"""End to end: realtime function calling on the tiny model (thread workers) behind a real server, with the
`openai` SDK's realtime client. A named `tool_choice` holds the random-weight thinker to a call of that
function (the grammar), which streams as a `function_call` item in the GA order with arguments valid
for the schema and no audio; the client's `function_call_output` and `response.create` continue the
turn, with the result in the thinker's prompt, and that answer is spoken."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from omnivoice.types import ChatMessage, TextPart
from tests.support.realtime_client import Recorder
from tests.support.serve import ServerThread, serve_tiny
from tests.support.speech import fixed

pytestmark = pytest.mark.slow

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
ASK = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Oslo?"}]}


@pytest.fixture(scope="module")
def server(tiny_checkpoint: Path) -> Iterator[ServerThread]:
    with serve_tiny(tiny_checkpoint) as st:
        yield st


def of_response(rec: Recorder, response_id: str) -> list[Any]:
    return [e for _, e in rec.events if getattr(e, "response_id", None) == response_id]


async def test_a_forced_call_and_its_output_continue_the_turn(server: ServerThread) -> None:
    client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    forced = {"type": "function", "name": "get_weather"}
    async with client.realtime.connect(model="omnivoice") as conn:
        rec = Recorder(conn)
        sid = (await rec.next("session.created")).session.id
        # a token budget the call fits in; the continued answer is 6 tokens and 8 frames of speech
        await conn.session.update(session={**fixed(6, 8), "tools": [WEATHER], "tool_choice": forced})
        await rec.next("session.updated")
        await conn.conversation.item.create(item=ASK)  # type: ignore[arg-type]
        await conn.response.create(response={"max_output_tokens": 64})
        called = (await rec.next("response.done", timeout=60)).response
        call = called.output[0]
        await conn.conversation.item.create(
            item={"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}
        )
        await conn.response.create(response={"tool_choice": "none"})
        answered = (await rec.next("response.done", timeout=60)).response
        messages = server.server.config.app.state.realtime.sessions[sid].last_response.messages
        await rec.close()
    events = [e.type for e in of_response(rec, called.id)]  # between response.created and .done
    steps = [t for t in events if t != "response.function_call_arguments.delta"]
    assert steps == [
        "response.output_item.added",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    assert "response.function_call_arguments.delta" in events and "response.output_audio.delta" not in events
    assert called.status == "completed" and [i.type for i in called.output] == ["function_call"]
    assert call.name == "get_weather" and call.status == "completed"
    arguments = json.loads(call.arguments)  # valid JSON of the schema, from random weights
    assert set(arguments) == {"city"} and isinstance(arguments["city"], str)
    deltas = [e for e in of_response(rec, called.id) if e.type == "response.function_call_arguments.delta"]
    assert "".join(d.delta for d in deltas) == call.arguments
    # the continued turn: the call and its result are in the prompt, and the answer is spoken
    assert messages[-2].role == "assistant" and messages[-2].tool_calls[0].id == call.call_id
    assert messages[-1] == ChatMessage("tool", (TextPart("sunny, 21 C"),), tool_call_id=call.call_id)
    assert answered.status in ("completed", "incomplete") and answered.output[0].type == "message"
    assert any(e.type == "response.output_audio.delta" for e in of_response(rec, answered.id))
