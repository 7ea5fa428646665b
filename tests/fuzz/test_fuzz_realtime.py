"""Fuzz the Realtime client events: the parser (`parse_client_event`) and a whole `Session` over the
fake engine. Events are valid ones with fields dropped, retyped, pushed to edge values or added, and
raw garbage. The contract: a typed event or a `ProtocolError` (an `error` event, the session goes on);
never another exception, never an `internal_error`, and the session still serves a turn afterwards.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from omnivoice.audio.vad import SileroVad
from omnivoice.config import parse_profile
from omnivoice.server.session import protocol as p
from omnivoice.server.session.outbox import Outbox
from omnivoice.server.session.session import Session
from omnivoice.types import TextPart
from tests.support.fake_engine import AlwaysAdmit, FakeEngine, Script, fake_model_info
from tests.support.fuzz_inputs.realtime import USER_ITEM, events

ERROR_CODES = {
    "invalid_json", "missing_required_parameter", "invalid_value", "unknown_parameter", "unsupported",
    "item_not_found", "input_audio_buffer_too_large", "input_audio_buffer_full",
    "input_audio_buffer_commit_empty", "conversation_already_has_active_response",
    "response_cancel_not_active", "event_too_large",
}  # fmt: skip


def _check_error(e: p.ProtocolError) -> None:
    assert e.code in ERROR_CODES, (e.code, e.message)
    assert isinstance(e.message, str) and e.message
    assert e.param is None or isinstance(e.param, str)
    assert e.event_id is None or isinstance(e.event_id, str)


@given(events)
@example('{"type": "session.update", "session": {"voice": 3}}')
@example('{"type": "input_audio_buffer.append", "audio": 5}')
@example(b"\xff\xfe")
@example("[" * 100_000)
def test_parse_client_event_returns_an_event_or_a_protocol_error(text: str | bytes) -> None:
    try:
        event = p.parse_client_event(text)
    except p.ProtocolError as e:
        _check_error(e)
        return
    assert event.type in p.EVENT_TYPES


# ---- a whole session -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vad() -> Iterator[SileroVad]:
    yield SileroVad()


PROFILE = parse_profile({"realtime": {"max_buffer_seconds": 3.0, "max_audio_ahead_ms": 0}})
FINAL_TURN = [
    {"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "still there?"}]}},
    {"type": "response.create", "response": {"instructions": "be brief", "output_modalities": ["text"]}},
]  # fmt: skip


async def _run_session(vad: SileroVad, messages: list[str | bytes]) -> list[dict[str, Any]]:
    """Feed `messages` to a fresh session, then a normal turn; returns every event the session sent."""
    sent: list[dict[str, Any]] = []

    async def send(text: str) -> None:
        sent.append(json.loads(text))

    engine = FakeEngine(fake_model_info("omnivoice"), Script(delay=0.0, audio_chunks=2))
    outbox = Outbox(send, "sess_fuzz", beta=False)
    writer = asyncio.create_task(outbox.run())
    session = Session("sess_fuzz", engine, outbox, vad, profile=PROFILE, admission=AlwaysAdmit())
    session.start()
    try:
        for message in messages:
            await session.handle(message)
        if session.response is not None:
            await session.response.cancel("client_cancelled")
        before = len(sent)
        for event in FINAL_TURN:
            await session.handle(json.dumps(event))
        if session.response is not None and session.response.task is not None:
            await asyncio.wait_for(session.response.task, 10)
        await asyncio.sleep(0)
        outbox.close()
        await asyncio.wait_for(writer, 10)
        final = [e for e in sent[before:] if e["type"] == "response.done"]
        assert final and final[-1]["response"]["status"] == "completed", sent[before:]
        for prompt in engine.prompts:  # text the tokenizer takes: a lone surrogate fails every prompt
            for message in prompt:
                for part in message.parts:
                    if isinstance(part, TextPart):
                        part.text.encode("utf-8")
        stages = PROFILE.stages
        for request in engine.requests:  # what reached the engine is within what the engine takes
            assert 1 <= request.thinker.max_tokens <= stages.thinker.max_seq_len, request.thinker
            assert 1 <= request.talker.max_tokens <= stages.talker.sampling.max_tokens, request.talker
            assert request.thinker.min_tokens <= request.thinker.max_tokens, request.thinker
    finally:
        await session.close()
        writer.cancel()
    return sent


def _check_session_events(sent: list[dict[str, Any]]) -> None:
    for event in sent:
        if event["type"] == "error":
            assert event["error"]["type"] == "invalid_request_error", event
            assert event["error"]["code"] in ERROR_CODES, event
        if event["type"] == "response.done" and event["response"]["status"] == "failed":
            # the fake engine never fails: only the client's input may (an empty conversation, ...)
            assert event["response"]["status_details"]["error"]["type"] == "invalid_request_error", event


@given(st.lists(events, min_size=1, max_size=6))
@example([json.dumps({"type": "response.create", "response": {"audio": {"output": "pcm16"}}})])
@example([json.dumps({"type": "response.create", "response": {"audio": {"output": {"voice": 7}}}})])
@example([json.dumps({"type": "response.create", "response": {"max_output_tokens": -5}})])
@example(  # more talker frames than the profile allows: the talker refused the request (a server error)
    [json.dumps({"type": "session.update", "session": {"omnivoice": {"output_audio_frames": 10**30}}}),
     json.dumps({"type": "conversation.item.create", "item": USER_ITEM}),
     json.dumps({"type": "response.create"})]
)  # fmt: skip
@example([json.dumps({"type": "conversation.item.truncate", "item_id": "x", "audio_end_ms": float("nan")})])
@example(
    [
        json.dumps(
            {
                "type": "conversation.item.create",
                "item": {  # kept, it failed every later prompt
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "\ud800"}],
                },
            }
        )
    ]
)
@example([json.dumps({"type": "session.update", "session": {"instructions": "a\udfffb"}})])
def test_a_session_answers_bad_events_with_errors_and_goes_on(vad: SileroVad, messages: list) -> None:
    _check_session_events(asyncio.run(_run_session(vad, messages)))
