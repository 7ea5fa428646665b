"""The Realtime protocol over a real server and the fake engine: errors, event order, dialects, limits."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator

import numpy as np
import pytest
import websockets

from tests.support.fake_engine import FakeServer, Script, serve_realtime
from tests.support.realtime_client import Recorder, client
from tests.support.speech import pcm16

PTT = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
TONE = np.sin(2 * np.pi * 220 * np.arange(12000) / 24000).astype(np.float32) * 0.3  # 0.5 s


@pytest.fixture(scope="module")
def srv() -> Iterator[FakeServer]:
    with serve_realtime(Script(audio_chunks=6, delay=0.005), max_buffer_seconds=5.0) as s:
        yield s


async def test_push_to_talk_turn_events_in_order(srv: FakeServer) -> None:
    async with client(srv.url).realtime.connect(model="omnivoice") as conn:
        rec = Recorder(conn)
        created = await rec.next("session.created")
        assert created.session.type == "realtime" and created.session.audio.output.voice == "ethan"
        await conn.session.update(session=PTT)
        updated = await rec.next("session.updated")
        assert updated.session.audio.input.turn_detection is None
        await conn.input_audio_buffer.append(audio=base64.b64encode(pcm16(TONE)).decode())
        await conn.input_audio_buffer.commit()
        committed = await rec.next("input_audio_buffer.committed")
        await conn.response.create()
        done = await rec.next("response.done")
        assert done.response.status == "completed"
        await rec.close()
    types = [t for t in rec.types() if t != "response.output_audio.delta"]
    transcript_deltas = [t for t in types if t == "response.output_audio_transcript.delta"]
    types = [t for t in types if t != "response.output_audio_transcript.delta"]
    assert len(transcript_deltas) == 5
    assert types == [
        "session.created", "session.updated", "input_audio_buffer.committed", "conversation.item.added",
        "conversation.item.done", "response.created", "response.output_item.added", "conversation.item.added",
        "response.content_part.added", "response.output_audio.done", "response.output_audio_transcript.done",
        "response.content_part.done", "response.output_item.done", "conversation.item.done", "response.done",
    ]  # fmt: skip
    assert len(rec.audio()) == 6 * 2400 * 2  # every fake chunk, pcm16 at 24 kHz
    item = done.response.output[0]
    assert item.content[0].transcript == "Hello there, friend!" and item.status == "completed"
    assert committed.item_id.startswith("item_") and committed.previous_item_id is None
    assert done.response.usage.output_tokens == 5


async def test_bad_events_get_errors_and_the_session_survives(srv: FakeServer) -> None:
    async with client(srv.url).realtime.connect(model="omnivoice") as conn:
        rec = Recorder(conn)
        await rec.next("session.created")

        async def expect(raw: str | dict, code: str, param: str | None = None) -> None:
            await conn.send_raw(raw if isinstance(raw, str) else json.dumps(raw))
            err = (await rec.next("error")).error
            assert err.code == code, err
            if param is not None:
                assert err.param == param, err

        await expect("{not json", "invalid_json")
        await expect("[1, 2]", "invalid_json")
        await expect({"type": "session.explode", "event_id": "ev1"}, "invalid_value", "type")
        assert rec.events[-1][1].error.event_id == "ev1"
        await expect({"type": "input_audio_buffer.commit"}, "input_audio_buffer_commit_empty")
        await expect({"type": "response.cancel"}, "response_cancel_not_active")
        await expect(
            {"type": "conversation.item.truncate", "item_id": "nope", "content_index": 0, "audio_end_ms": 10},
            "item_not_found",
        )
        await expect({"type": "conversation.item.retrieve", "item_id": "nope"}, "item_not_found")
        await expect({"type": "conversation.item.delete", "item_id": "nope"}, "item_not_found")
        await expect(
            {"type": "input_audio_buffer.append", "audio": "%%%not base64%%%"}, "invalid_value", "audio"
        )
        await expect(
            {"type": "input_audio_buffer.append", "audio": "AA=="}, "invalid_value", "audio"
        )  # 1 byte
        huge = base64.b64encode(bytes(24000 * 2 * 6)).decode()  # 6 s > the 5 s buffer
        await expect({"type": "input_audio_buffer.append", "audio": huge}, "input_audio_buffer_too_large")
        await expect({"type": "input_audio_buffer.append"}, "missing_required_parameter", "audio")
        await expect(
            {"type": "input_audio_buffer.append", "audio": "", "bogus": 1}, "unknown_parameter", "bogus"
        )
        await expect(
            {"type": "session.update", "session": {"voice": "nobody"}}, "invalid_value", "session.voice"
        )
        bad_format = {"audio": {"input": {"format": {"type": "audio/x"}}}}
        await expect(
            {"type": "session.update", "session": bad_format},
            "invalid_value",
            "session.audio.input.format.type",
        )
        await expect({"type": "session.update", "session": {"frobnicate": True}}, "unknown_parameter")
        await expect({"type": "conversation.item.create", "item": {"type": "function_call"}}, "invalid_value")
        too_short = base64.b64encode(bytes(2 * 288)).decode()  # 12 ms: no feature frame in it
        item = {"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": too_short}]}
        await expect(
            {"type": "conversation.item.create", "item": item}, "invalid_value", "item.content[0].audio"
        )
        # after all that, a normal turn still works
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
        )
        await conn.response.create()
        await expect({"type": "response.create"}, "conversation_already_has_active_response")
        assert (await rec.next("response.done")).response.status == "completed"
        await rec.close()


async def test_unservable_tools_and_stored_prompts_are_refused_naming_the_param(srv: FakeServer) -> None:
    async with client(srv.url).realtime.connect(model="omnivoice") as conn:
        rec = Recorder(conn)
        await rec.next("session.created")
        # what SDKs and consoles send by default is accepted
        await conn.session.update(session={"type": "realtime", "tools": [], "tool_choice": "auto"})
        assert (await rec.next("session.updated")).session.tool_choice == "auto"
        refused = [
            ({"type": "session.update", "session": {"tool_choice": "required"}}, "session.tool_choice"),
            ({"type": "session.update", "session": {"prompt": {"id": "pmpt_1"}}}, "session.prompt"),
            ({"type": "response.create", "response": {"tool_choice": "required"}}, "response.tool_choice"),
            ({"type": "response.create", "response": {"tool_choice": {"type": "function", "name": "f"}}},
             "response.tool_choice.name"),
            ({"type": "session.update", "session": {"tools": [{"type": "mcp", "server_label": "x"}]}},
             "session.tools.0.type"),
            ({"type": "session.update", "session": {"tools": [F, F]}}, "session.tools.1.name"),
            ({"type": "response.create", "response": {"prompt": {"id": "pmpt_1"}}}, "response.prompt"),
        ]  # fmt: skip
        for event, param in refused:
            await conn.send_raw(json.dumps(event))
            err = (await rec.next("error")).error
            assert err.param == param, err
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
        )
        await conn.response.create(response={"tool_choice": "none"})
        assert (await rec.next("response.done")).response.status == "completed"
        await rec.close()


F = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}


async def test_item_create_retrieve_delete_and_ordering(srv: FakeServer) -> None:
    async with client(srv.url).realtime.connect(model="omnivoice") as conn:
        rec = Recorder(conn)
        await conn.session.update(session=PTT)
        text = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "first"}]}
        await conn.conversation.item.create(item={**text, "id": "item_a"})
        audio = base64.b64encode(pcm16(TONE)).decode()
        await conn.conversation.item.create(
            item={"id": "item_b", "type": "message", "role": "user",
                  "content": [{"type": "input_audio", "audio": audio}]},
            previous_item_id="root",
        )  # fmt: skip
        added = [await rec.next("conversation.item.added") for _ in range(2)]
        assert added[0].previous_item_id is None and added[1].previous_item_id is None  # b went first
        await conn.conversation.item.retrieve(item_id="item_b")
        got = (await rec.next("conversation.item.retrieved")).item
        back = np.frombuffer(base64.b64decode(got.content[0].audio), "<i2").astype(np.float32) / 32768
        assert (
            abs(back.size - TONE.size) <= 2
            and np.abs(back[500:-500] - TONE[500 : back.size - 500]).max() < 0.02
        )
        await conn.conversation.item.delete(item_id="item_a")
        assert (await rec.next("conversation.item.deleted")).item_id == "item_a"
        await conn.response.create()
        await rec.next("response.done")
        await rec.close()
    prompt = srv.engine.prompts[-1]
    assert [m.role for m in prompt] == ["user"]  # item_a deleted; only the audio item remains


async def test_g711_both_ways_and_text_only(srv: FakeServer) -> None:
    for fmt, beta_name in (("audio/pcmu", "g711_ulaw"), ("audio/pcma", "g711_alaw")):
        async with client(srv.url).realtime.connect(model="omnivoice") as conn:
            rec = Recorder(conn)
            audio_cfg = {
                "input": {"format": {"type": fmt}, "turn_detection": None},
                "output": {"format": {"type": fmt}},
            }
            await conn.session.update(session={"type": "realtime", "audio": audio_cfg})
            s = (await rec.next("session.updated")).session
            assert s.audio.input.format.type == fmt and s.audio.output.format.type == fmt
            await conn.input_audio_buffer.append(audio=base64.b64encode(bytes([0xFF] * 8000)).decode())  # 1 s
            await conn.input_audio_buffer.commit()
            await conn.response.create()
            done = await rec.next("response.done")
            assert done.response.status == "completed", (beta_name, done.response.status_details)
            # 0.6 s of fake audio at 8 kHz, one byte per sample, give or take the resampler's edges
            assert abs(len(rec.audio()) - 4800) <= 40
            await rec.close()
    async with client(srv.url).realtime.connect(model="omnivoice") as conn:
        rec = Recorder(conn)
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
        )
        await conn.response.create(response={"output_modalities": ["text"]})
        done = await rec.next("response.done")
        assert done.response.output[0].content[0].text == "Hello there, friend!"
        assert "response.output_text.delta" in rec.types() and not rec.audio()
        await rec.close()


async def test_beta_clients_get_beta_names(srv: FakeServer) -> None:
    url = srv.url.replace("http", "ws") + "/v1/realtime?model=gpt-4o-realtime-preview"
    async with websockets.connect(url, additional_headers={"OpenAI-Beta": "realtime=v1"}) as ws:
        created = json.loads(await ws.recv())
        assert created["type"] == "session.created" and created["session"]["input_audio_format"] == "pcm16"
        session = {"modalities": ["text", "audio"], "input_audio_format": "g711_ulaw", "turn_detection": None,
                   "voice": "alloy", "max_response_output_tokens": "inf", "temperature": 0.7}  # fmt: skip
        await ws.send(json.dumps({"type": "session.update", "session": session}))
        updated = json.loads(await ws.recv())
        assert (
            updated["type"] == "session.updated" and updated["session"]["input_audio_format"] == "g711_ulaw"
        )
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
        await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
        await ws.send(json.dumps({"type": "response.create"}))
        types = []
        while not types or types[-1] != "response.done":
            event = json.loads(await ws.recv())
            types.append(event["type"])
            if event["type"] == "response.output_item.done":
                assert event["item"]["content"][0]["type"] == "audio"
    assert "conversation.item.created" in types and "conversation.item.added" not in types
    assert "response.audio.delta" in types and "response.audio_transcript.delta" in types
    assert "response.output_audio.delta" not in types


async def test_session_limit_and_idle_timeout() -> None:
    with serve_realtime(max_sessions=1, idle_timeout_s=0.5) as s:
        url = s.url.replace("http", "ws") + "/v1/realtime"
        async with websockets.connect(url) as first:
            assert json.loads(await first.recv())["type"] == "session.created"
            async with websockets.connect(url) as second:
                err = json.loads(await second.recv())
                assert err["type"] == "error" and err["error"]["code"] == "session_limit_reached"
                await asyncio.wait_for(second.wait_closed(), 5)
                assert second.close_code == 1013
            err = json.loads(await asyncio.wait_for(first.recv(), 5))  # idle for 0.5 s
            assert err["error"]["code"] == "session_idle_timeout"
            await asyncio.wait_for(first.wait_closed(), 5)
        async with websockets.connect(url) as third:  # the slot was released
            assert json.loads(await third.recv())["type"] == "session.created"
