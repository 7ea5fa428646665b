"""Transcripts of the caller over the fake engine, through a real server and the `openai` SDK: what the
transcription asks the engine for, the events it streams, the transcript kept on the item, a failure."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from omnivoice.server.session.session_config import Transcription
from omnivoice.server.session.transcription import instruction
from omnivoice.types import AudioPart, TextPart
from tests.support.fake_engine import FakeServer, Script, serve_realtime
from tests.support.polling import until
from tests.support.realtime_client import Recorder, client, send_audio
from tests.support.speech import pcm16

ASR = {"model": "whisper-1", "language": "en"}
PUSH_TO_TALK = {"type": "realtime", "audio": {"input": {"turn_detection": None, "transcription": ASR}}}
TONE = 0.3 * np.sin(np.linspace(0, 2000, 24000)).astype(np.float32)  # 1 s: "speech" the fake never hears


@pytest.fixture(scope="module")
def srv() -> Iterator[FakeServer]:
    with serve_realtime(Script(texts=("Hello", " there", ",", " friend", "!"), audio_chunks=2)) as s:
        yield s


async def committed_turn(conn: Any, rec: Recorder, session: dict[str, Any]) -> str:
    await conn.session.update(session=session)
    await rec.next("session.updated")
    await send_audio(conn, pcm16(TONE))
    await conn.input_audio_buffer.commit()
    return str((await rec.next("input_audio_buffer.committed")).item_id)


async def test_a_committed_turn_is_transcribed_beside_its_response(srv: FakeServer) -> None:
    async with client(srv.url).realtime.connect(model="omnivoice") as conn:
        rec = Recorder(conn)
        await rec.next("session.created")
        item_id = await committed_turn(conn, rec, PUSH_TO_TALK)
        await conn.response.create()
        await rec.next("response.done")
        completed = await rec.first("conversation.item.input_audio_transcription.completed")
        await conn.conversation.item.retrieve(item_id=item_id)
        retrieved = await rec.next("conversation.item.retrieved")
        await conn.response.create()  # a later turn: it still hears the audio, not the transcript
        await rec.next("response.done")
        updated = next(e for _, e in rec.events if e.type == "session.updated")
        await rec.close()
    deltas = [e for _, e in rec.events if e.type == "conversation.item.input_audio_transcription.delta"]
    assert [d.delta for d in deltas] == ["Hello", " there", ",", " friend", "!"]
    assert {(d.item_id, d.content_index) for d in deltas} == {(item_id, 0)}
    assert completed.item_id == item_id and completed.content_index == 0
    assert completed.transcript == "Hello there, friend!"
    assert completed.usage.type == "tokens" and completed.usage.output_tokens == 5
    assert retrieved.item.content[0].transcript == "Hello there, friend!"
    assert updated.session.audio.input.transcription.model == "whisper-1"
    # the responses and the transcription are separate requests; only the responses want audio
    ours = srv.engine.requests[-3:]
    (asr,) = [r for r in ours if not r.want_audio]
    assert sum(r.want_audio for r in ours) == 2
    assert asr.thinker.temperature == 0 and asr.cache_key is None
    (message,) = next(p for p in srv.engine.prompts if len(p) == 1 and len(p[0].parts) == 2)
    audio, text = message.parts
    assert message.role == "user" and isinstance(audio, AudioPart) and audio.sample_rate == 16000
    assert text == TextPart(instruction(Transcription(language="en")))
    later = srv.engine.prompts[-1]
    assert [m.role for m in later] == ["user", "assistant"]
    assert len(later[0].parts) == 1 and isinstance(later[0].parts[0], AudioPart)


async def test_no_transcription_unless_asked(srv: FakeServer) -> None:
    session = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
    async with client(srv.url).realtime.connect(model="omnivoice") as conn:
        rec = Recorder(conn)
        created = await rec.next("session.created")
        before = len(srv.engine.requests)
        await committed_turn(conn, rec, session)
        await conn.response.create()
        await rec.next("response.done")
        await until(lambda: not srv.engine.running, 5, "the engine idle")
        await rec.close()
    assert created.session.audio.input.transcription is None
    assert len(srv.engine.requests) == before + 1  # the response only
    assert not [t for t in rec.types() if "input_audio_transcription" in t]


async def test_a_failed_transcription_names_its_item() -> None:
    with serve_realtime(Script(texts=("Hi",), audio_chunks=0, finish_reason="error")) as failing:
        async with client(failing.url).realtime.connect(model="omnivoice") as conn:
            rec = Recorder(conn)
            await rec.next("session.created")
            beta = {**PUSH_TO_TALK, "audio": {"input": {"turn_detection": None}}}
            item_id = await committed_turn(conn, rec, {**beta, "input_audio_transcription": ASR})
            failed = await rec.next("conversation.item.input_audio_transcription.failed")
            await rec.close()
    assert failed.item_id == item_id and failed.content_index == 0
    assert failed.error.code == "engine_error" and failed.error.message == "boom"
    assert "conversation.item.input_audio_transcription.completed" not in rec.types()
