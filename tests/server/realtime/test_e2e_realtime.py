"""End to end: the tiny model (thread workers) behind a real server, driven by the `openai` SDK's realtime
client with espeak-ng speech: server VAD and push-to-talk turns, multi-turn history, barge-in, truncation,
disconnects."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

from omnivoice.audio.resample import StreamResampler
from omnivoice.server.session.session_config import Transcription
from omnivoice.server.session.transcription import transcription_messages
from omnivoice.types import AudioPart, Finished, GenerationRequest, Sampling, TextDelta, TextPart
from tests.support.polling import until
from tests.support.realtime_client import Recorder, send_audio
from tests.support.serve import ServerThread, serve_tiny
from tests.support.speech import fixed, pcm16, speak

pytestmark = pytest.mark.slow

SAMPLES_PER_FRAME = 1920  # 80 ms of 24 kHz audio per codec frame


@pytest.fixture(scope="module")
def server(tiny_checkpoint: Path) -> Iterator[ServerThread]:
    realtime = {"max_buffer_seconds": 30, "transcription_max_tokens": 12}
    with serve_tiny(tiny_checkpoint, realtime=realtime) as st:
        yield st


@pytest.fixture(scope="module")
def voice(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    folder = tmp_path_factory.mktemp("speech")
    return {
        "one": speak("Hello there. Could you tell me a short story about the sea?", folder),
        "two": speak("Thank you. And what happened to the lighthouse?", folder),
        "stop": speak("Wait, stop, stop please.", folder),
    }


def connect(server: ServerThread) -> Any:
    client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    return client.realtime.connect(model="omnivoice")


def session_of(server: ServerThread, session_id: str) -> Any:
    return server.server.config.app.state.realtime.sessions[session_id]


async def test_server_vad_spoken_turn(server: ServerThread, voice: dict[str, np.ndarray]) -> None:
    speech = voice["one"]
    async with connect(server) as conn:
        rec = Recorder(conn)
        sid = (await rec.next("session.created")).session.id
        await conn.session.update(session=fixed(6, 12))
        await send_audio(conn, pcm16(0.5, speech, 1.0))
        started = await rec.next("input_audio_buffer.speech_started")
        stopped = await rec.next("input_audio_buffer.speech_stopped")
        committed = await rec.next("input_audio_buffer.committed")
        done = await rec.next("response.done", timeout=60)
        item = session_of(server, sid).conversation.get(committed.item_id)
        await rec.close()
    speech_ms = 1000 * speech.size / 24000
    assert started.item_id == stopped.item_id == committed.item_id
    assert 100 <= started.audio_start_ms <= 600  # speech at ~500 ms, minus 300 ms of prefix padding
    assert abs(stopped.audio_end_ms - (500 + speech_ms + 500)) < 400
    held = item.content[0].audio.size / 16
    # the turn up to where its speech paused, as the response heard it (speculative start, on by
    # default): the silence window that confirmed the turn (15 more frames of 32 ms) is left out
    assert 470 < (stopped.audio_end_ms - started.audio_start_ms) - held < 600  # ms
    # min = max tokens: the thinker always stops at max_output_tokens
    assert done.response.status == "incomplete" and done.response.status_details.reason == "max_output_tokens"
    order = [t for t in rec.types() if not t.endswith(".delta")]
    expected = [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "response.created",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.done",
    ]
    assert [t for t in order if t in expected] == expected
    assert abs(len(rec.audio()) // 2 - 12 * SAMPLES_PER_FRAME) < SAMPLES_PER_FRAME  # 12 frames, pcm16
    assert done.response.usage.output_tokens == 6


async def test_a_spoken_turn_is_transcribed_by_the_served_model(
    server: ServerThread, voice: dict[str, np.ndarray]
) -> None:
    asr = {"audio": {"input": {"transcription": {"model": "gpt-4o-transcribe"}}}}
    async with connect(server) as conn:
        rec = Recorder(conn)
        sid = (await rec.next("session.created")).session.id
        await conn.session.update(session=fixed(4, 4, **asr))
        await send_audio(conn, pcm16(0.5, voice["two"], 1.0))
        committed = await rec.next("input_audio_buffer.committed")
        await rec.next("response.done", timeout=60)
        completed = await rec.first("conversation.item.input_audio_transcription.completed", timeout=60)
        item = session_of(server, sid).conversation.get(committed.item_id)
        await rec.close()
    deltas = [e for _, e in rec.events if e.type == "conversation.item.input_audio_transcription.delta"]
    assert completed.item_id == committed.item_id and completed.content_index == 0
    assert completed.transcript and "".join(d.delta for d in deltas) == completed.transcript
    assert {d.item_id for d in deltas} == {committed.item_id}
    assert item.content[0].transcript == completed.transcript
    assert 0 < completed.usage.output_tokens <= 12
    # the same text-only request, straight to the engine, writes the same words
    messages = transcription_messages(item, 0, Transcription())
    assert await _engine_text(server, messages, 12) == completed.transcript


async def _engine_text(server: ServerThread, messages: Any, max_tokens: int) -> str:
    engine = server.server.config.app.state.lifecycle.engine
    request = GenerationRequest(
        "direct", engine.build_prompt(messages), want_audio=False, thinker=Sampling(max_tokens=max_tokens)
    )

    async def run() -> str:
        text = ""
        async for out in engine.generate(request):
            text += out.text if isinstance(out, TextDelta) else ""
            assert not isinstance(out, Finished) or out.finish_reason in ("stop", "length")
        return text

    return await on_server_loop(server, run())  # the engine's event loop


async def test_push_to_talk_history_feeds_the_thinker(
    server: ServerThread, voice: dict[str, np.ndarray]
) -> None:
    async with connect(server) as conn:
        rec = Recorder(conn)
        sid = (await rec.next("session.created")).session.id
        await conn.session.update(session=fixed(6, 8, audio={"input": {"turn_detection": None}}))
        dones = []
        for name in ("one", "two"):
            await send_audio(conn, pcm16(voice[name]))
            await conn.input_audio_buffer.commit()
            await rec.next("input_audio_buffer.committed")
            await conn.response.create()
            dones.append(await rec.next("response.done", timeout=60))
        assert "input_audio_buffer.speech_started" not in rec.types()
        session = session_of(server, sid)
        first_user, first_reply = session.conversation.items[0], session.conversation.items[1]
        messages = session.last_response.messages
        await rec.close()
    assert [d.response.status for d in dones] == ["incomplete", "incomplete"]
    transcript = dones[0].response.output[0].content[0].transcript
    assert transcript and first_reply.content[0].transcript == transcript
    assert [m.role for m in messages] == ["user", "assistant", "user"]
    audio = messages[0].parts[0]
    assert isinstance(audio, AudioPart) and audio.sample_rate == 16000
    assert (
        audio.pcm is first_user.content[0].audio
        and abs(audio.pcm.size / 16000 - voice["one"].size / 24000) < 0.05
    )
    assert messages[1].parts == (TextPart(transcript),)
    assert isinstance(messages[2].parts[0], AudioPart)
    first, second = dones[0].response.usage.input_tokens, dones[1].response.usage.input_tokens
    assert second > first + 20, (first, second)  # turn 1's audio and reply are in turn 2's prompt


async def test_barge_in_cancels_while_the_caller_speaks_and_truncate_edits_history(
    server: ServerThread, voice: dict[str, np.ndarray]
) -> None:
    engine = server.server.config.app.state.lifecycle.engine
    async with connect(server) as conn:
        rec = Recorder(conn)
        sid = (await rec.next("session.created")).session.id
        await conn.session.update(session=fixed(24, 150))  # 12 s of audio: still playing when we interrupt
        await send_audio(conn, pcm16(0.3, voice["one"], 0.8))
        first = await rec.next("response.created", timeout=30)
        await rec.next("response.output_audio.delta", timeout=30)
        await asyncio.sleep(0.5)
        await send_audio(conn, pcm16(voice["stop"], 0.8), pace=1.0)
        started = await rec.next("input_audio_buffer.speech_started")
        done = await rec.next("response.done")
        assert done.response.id == first.response.id
        assert done.response.status == "cancelled" and done.response.status_details.reason == "turn_detected"
        heard = len(rec.audio(first.response.id)) / 48  # ms of audio received
        assert heard < 12_000 * 0.6  # paced: most of the 12 s was never sent
        stopped = await rec.next("input_audio_buffer.speech_stopped")
        # the cut comes while the caller still speaks: before the end of the interruption is even
        # detected (the latency itself is `omnivoice bench realtime`'s to measure)
        events = [e for _, e in rec.events]
        at = {id(e): n for n, e in enumerate(events)}
        at_done = at[id(done)]
        assert at[id(started)] < at_done < at[id(stopped)]
        late = [e for e in events[at_done:] if e.type == "response.output_audio.delta"]
        assert all(e.response_id != first.response.id for e in late)  # nothing of it after its done
        second = await rec.next("response.created", timeout=10)
        # the client heard half of what was sent before it stopped playback; an offset past the end
        # is clamped (what was sent depends on the machine's speed: a busy one sends less)
        item_id = done.response.output[0].id
        session = session_of(server, sid)
        full = session.conversation.get(item_id).ledger.transcript
        await conn.conversation.item.truncate(item_id=item_id, content_index=0, audio_end_ms=10**9)
        clamped = await rec.next("conversation.item.truncated")
        assert 0 < clamped.audio_end_ms <= heard + 1
        half = max(1, clamped.audio_end_ms // 2)
        await conn.conversation.item.truncate(item_id=item_id, content_index=0, audio_end_ms=half)
        truncated = await rec.next("conversation.item.truncated")
        kept = session.conversation.get(item_id).content[0].transcript
        assert truncated.audio_end_ms == half and len(kept) < len(full) and full.startswith(kept)
        await conn.response.cancel()
        cancelled = await rec.next("response.done")
        assert cancelled.response.id == second.response.id
        assert cancelled.response.status_details.reason == "client_cancelled"
        await rec.close()
    await until(lambda: not engine.stats().active_requests, 10, "the cancelled response aborted")


def _idle(engine: Any, app: Any) -> bool:
    stats = engine.stats()
    idle = all(s.running == 0 and s.queued == 0 for s in stats.stages)
    sessions_gone = not app.state.realtime.sessions and app.state.admission.in_flight == 0
    return idle and not stats.active_requests and sessions_gone


async def test_disconnect_aborts_the_response_everywhere(
    server: ServerThread, voice: dict[str, np.ndarray]
) -> None:
    app = server.server.config.app
    engine = app.state.lifecycle.engine
    async with connect(server) as conn:
        rec = Recorder(conn)
        await conn.session.update(session=fixed(24, 150, audio={"input": {"turn_detection": None}}))
        await send_audio(conn, pcm16(voice["two"]))
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        await rec.next("response.output_audio.delta", timeout=30)
        assert engine.stats().active_requests == 1
        await rec.close()
    await until(lambda: _idle(engine, app), 10, "the engine and the sessions left idle")
    assert app.state.admission.in_flight == 0


async def push_to_talk(server: ServerThread, conn: Any) -> tuple[Recorder, Any]:
    """A new connection's recorder and server-side session, its turn detection off."""
    rec = Recorder(conn)
    sid = (await rec.next("session.created")).session.id
    await conn.session.update(session=fixed(4, 4, audio={"input": {"turn_detection": None}}))
    await rec.next("session.updated")
    return rec, session_of(server, sid)


async def on_server_loop(server: ServerThread, coro: Any) -> Any:
    """Run `coro` on the server's event loop (the sessions'), as its own messages are handled."""
    loop = server.server.servers[0].get_loop()
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))


async def test_appends_received_together_are_one_front_door_job(
    server: ServerThread, voice: dict[str, np.ndarray]
) -> None:
    """A session that fell behind its caller handles the appends queued meanwhile together
    (`Session.handle_all`): one front-door job a run (of up to 25), a bad append its own error,
    and every other one's audio kept in order."""
    audio = pcm16(voice["one"])[: 40 * 960]  # 40 appends of 20 ms
    chunks = [audio[i : i + 960] for i in range(0, len(audio), 960)]
    texts = [
        json.dumps(
            {"type": "input_audio_buffer.append", "event_id": f"ev{i}", "audio": base64.b64encode(c).decode()}
        )
        for i, c in enumerate(chunks)
    ]
    texts[7] = json.dumps({"type": "input_audio_buffer.append", "event_id": "ev7", "audio": "not base64!"})
    door = server.server.config.app.state.realtime.front_door
    async with connect(server) as conn:
        rec, session = await push_to_talk(server, conn)
        jobs = door.jobs
        await on_server_loop(server, session.handle_all(texts))
        assert door.jobs - jobs == 2  # runs of at most RUN_APPENDS (25)
        bad = await rec.next("error")
        assert (bad.error.event_id, bad.error.code) == ("ev7", "invalid_value")
        await conn.input_audio_buffer.commit()
        committed = await rec.next("input_audio_buffer.committed")
        item = session.conversation.get(committed.item_id)
        kept = np.concatenate([np.frombuffer(c, "<i2") for i, c in enumerate(chunks) if i != 7])
        await rec.close()
    # the 39 good appends of 480 samples at 24 kHz in order, resampled to 16 kHz as one stream
    resampler = StreamResampler(24000, 16000)
    expected = np.concatenate([resampler.process(kept.astype(np.float32) / 32768), resampler.flush()])
    np.testing.assert_allclose(item.content[0].audio, expected, atol=1e-5)


async def test_a_run_of_appends_past_the_buffer_keeps_what_fits(server: ServerThread) -> None:
    """A run of appends handled together is buffered append by append: the buffer fills up to its
    limit and only the appends past it are refused, each with its own error."""
    chunk = base64.b64encode(pcm16(0.02)).decode()  # 20 ms: 320 samples at 16 kHz
    n = 1550  # 31 s: past the module server's 30 s buffer
    texts = [
        json.dumps({"type": "input_audio_buffer.append", "event_id": f"ev{i}", "audio": chunk})
        for i in range(n)
    ]
    async with connect(server) as conn:
        rec, session = await push_to_talk(server, conn)
        await on_server_loop(server, session.handle_all(texts))
        held = session.buffer.samples
        await conn.input_audio_buffer.clear()  # its event follows every error of the run
        await rec.next("input_audio_buffer.cleared")
        errors = [e.error for _, e in rec.events if e.type == "error"]
        await rec.close()
    assert {e.code for e in errors} == {"input_audio_buffer_full"}
    # the appends past the limit, and only those (an append resamples to 319-321 samples, so a
    # shorter one may still fit after a longer one did not)
    refused = [int(e.event_id[2:]) for e in errors]
    assert refused == sorted(refused) and min(refused) >= 1490 and refused[-1] == n - 1
    assert 30 * 16000 - 2 * 480 < held <= 30 * 16000  # less than two appends' room left


async def test_events_received_together_let_the_loop_in_between(server: ServerThread) -> None:
    """A client that queued many events holds the event loop no longer than one at a time: between
    the events of one `handle_all` the loop's other tasks run (here a ticker beside it)."""
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a note"}]}
    texts = [json.dumps({"type": "conversation.item.create", "item": item}) for _ in range(300)]
    async with connect(server) as conn:
        rec = Recorder(conn)
        session = session_of(server, (await rec.next("session.created")).session.id)

        async def ticks_during() -> int:
            ticks, done = 0, False

            async def tick() -> None:
                nonlocal ticks
                while not done:
                    ticks += 1
                    await asyncio.sleep(0)

            ticker = asyncio.create_task(tick())
            await asyncio.sleep(0)
            start = ticks
            await session.handle_all(texts)
            during, done = ticks - start, True
            await ticker
            return during

        during = await on_server_loop(server, ticks_during())
        await rec.close()
    assert during >= len(texts) - 1
    assert len(session.conversation.items) == len(texts)
