"""`conversation.item.create` of `function_call` and `function_call_output` items over a real server
(fake engine): how they are kept and shown, and what is refused, naming the field."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.support.fake_engine import FakeServer, serve_realtime
from tests.support.realtime_client import Recorder, client


@pytest.fixture(scope="module")
def srv() -> Iterator[FakeServer]:
    with serve_realtime() as s:
        yield s


async def test_function_call_items_and_their_outputs(srv: FakeServer) -> None:
    call = {"type": "function_call", "name": "get_weather", "arguments": '{"city": "Oslo"}', "call_id": "c1"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "sunny"}
    refused = [
        ({"type": "function_call_output", "call_id": "nope", "output": "x"}, "item.call_id"),
        ({"type": "function_call_output", "call_id": "c1"}, "item.output"),
        ({"type": "function_call", "name": "f", "arguments": "[1]"}, "item.arguments"),
        ({"type": "function_call", "arguments": "{}"}, "item.name"),
        ({"type": "function_call", "name": "f", "role": "user"}, "item.role"),
    ]
    async with client(srv.url).realtime.connect(model="omnivoice") as conn:
        rec = Recorder(conn)
        await rec.next("session.created")
        for item, param in refused:
            await conn.send_raw(json.dumps({"type": "conversation.item.create", "item": item}))
            assert (await rec.next("error")).error.param == param, item
        await conn.conversation.item.create(item=call)  # type: ignore[arg-type]
        added_call = (await rec.next("conversation.item.done")).item
        await conn.conversation.item.create(item=output)  # type: ignore[arg-type]
        added_output = (await rec.next("conversation.item.done")).item
        await conn.conversation.item.retrieve(item_id=added_output.id)
        retrieved = (await rec.next("conversation.item.retrieved")).item
        await rec.close()
    assert added_call.type == "function_call" and added_call.call_id == "c1"
    assert added_call.name == "get_weather" and added_call.arguments == '{"city": "Oslo"}'
    assert added_output.type == "function_call_output" and added_output.output == "sunny"
    assert retrieved.call_id == "c1" and retrieved.output == "sunny"
