"""End to end: whole phone calls over `/v1/telephony/twilio` against the tiny model (thread workers)
behind a real server, with the exact messages Twilio sends and espeak-ng speech as u-law 20 ms frames:
the response as paced `media` frames closed by marks, echoed marks as the played position, barge-in
(`clear`, a cancelled response, the history truncated at what was heard), `stop`, malformed frames."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
import runpy
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from omnivoice.server.session.delivery import PARTS
from tests.support.polling import until
from tests.support.serve import ServerThread, serve_tiny
from tests.support.speech import fixed_call, speak
from tests.support.twilio_carrier import FRAME, Carrier, call, ulaw

pytestmark = pytest.mark.slow

BYTES_PER_CODEC_FRAME = 640  # 80 ms at 8 kHz


@pytest.fixture(scope="module")
def server(tiny_checkpoint: Path) -> Iterator[ServerThread]:
    with serve_tiny(tiny_checkpoint) as st:
        yield st


@pytest.fixture(scope="module")
def voice(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    folder = tmp_path_factory.mktemp("speech")
    return {
        "one": ulaw(0.4, speak("Hello there. Could you tell me a short story about the sea?", folder), 1.0),
        "stop": ulaw(speak("Wait, stop, stop please.", folder), 1.0),
    }


def the_session(server: ServerThread) -> Any:
    (session,) = server.server.config.app.state.realtime.sessions.values()
    return session


def _idle(engine: Any, app: Any) -> bool:
    stats = engine.stats()
    idle = all(s.running == 0 and s.queued == 0 for s in stats.stages)
    sessions_gone = not app.state.realtime.sessions and app.state.admission.in_flight == 0
    return idle and not stats.active_requests and sessions_gone


async def echo_marks(carrier: Carrier, count: int | None = None) -> None:
    """Echo the marks received so far (the first `count` of them), as a carrier does once played."""
    for m in carrier.of("mark")[:count]:
        await carrier.mark(m["mark"]["name"])


async def test_call_answers_in_paced_media_frames_closed_by_marks(
    server: ServerThread, voice: dict[str, bytes], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="omnivoice.server.session.response")
    door = server.server.config.app.state.realtime.front_door  # the app's: the call's audio goes through it
    jobs = door.jobs
    async with call(server.base_url) as carrier:
        await carrier.connected()
        await carrier.start(**fixed_call(6, 12, voice="chelsie", instructions="Answer briefly."))
        await carrier.play(voice["one"])
        first = await carrier.next("media", timeout=60)
        session = the_session(server)
        # the frames went through the app's front door, those that queued up together in one job,
        # and none of their audio was lost: 8 kHz u-law in, 16 kHz out (the resampler holds < 40 ms)
        assert door.workers >= 1 and door.jobs > jobs
        await until(lambda: session.buffer.end >= 2 * len(voice["one"]) - 640, 20)
        await until(lambda: session.last_response is not None, 20)
        item = session.conversation.items[-1]
        generated = item.ledger.generated  # u-law samples (bytes)
        await until(lambda: len(carrier.audio()) >= generated, 20)
        await asyncio.sleep(0.1)  # the end mark follows the last frame
        await echo_marks(carrier)
        await until(lambda: item.ledger.sent == generated, 20)
        media, marks = carrier.of("media"), carrier.of("mark")
        last = media[-1]
    metrics = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    appends = re.search(r"^omnivoice_front_door_appends_total (\S+)$", metrics, re.M)
    assert appends is not None and float(appends[1]) >= jobs + 1
    # each job moved the session's intake clock, exported as a histogram
    intake = re.search(r"^omnivoice_realtime_intake_lag_seconds_count (\S+)$", metrics, re.M)
    assert intake is not None and float(intake[1]) >= 1
    # the response's first audio as the server sent it, and where its engine request's wait went
    for series in (
        'omnivoice_realtime_response_seconds_count{phase="first_audio"}',
        'omnivoice_realtime_engine_first_audio_seconds_count{part="to_first_token"}',
        'omnivoice_realtime_engine_first_audio_seconds_count{part="decode"}',
        "omnivoice_realtime_playback_underrun_seconds_count",
    ):
        found = re.search(rf"^{re.escape(series)} (\S+)$", metrics, re.M)
        assert found is not None and float(found[1]) >= 1, series
    # the thinker computed the call's prompt and encoded its speech (the bench reads these per run)
    for series in (
        'omnivoice_stage_prompt_positions_total{source="computed",stage="thinker"}',
        'omnivoice_stage_audio_windows_total{source="encoded",stage="thinker"}',
    ):
        found = re.search(rf"^{re.escape(series)} (\S+)$", metrics, re.M)
        assert found is not None and float(found[1]) >= 1, series
    cached = 'omnivoice_stage_prompt_positions_total{source="cached",stage="thinker"} '
    assert cached in metrics  # exported from the start, 0 until a conversation's prefix is reused
    # and the server's log names the response with the same parts (a slow turn's is found by its id)
    said = [r.getMessage() for r in caplog.records if session.last_response.id in r.getMessage()]
    logged = [m for m in said if "the engine's first audio" in m]
    assert len(logged) == 1 and re.search(r"to_first_token \d+ ms, .*, to_engine \d+ ms$", logged[0]), said
    slow_turns = runpy.run_path(str(Path(__file__).parents[3] / "benchmarks" / "slow_turns.py"))
    parts = slow_turns["logged_parts"](logged[0])[session.last_response.id]  # the GPU runs' tool reads it
    assert set(parts) == {"after", *PARTS}
    assert session.settings.voice == "chelsie" and session.settings.instructions == "Answer briefly."
    assert session.last_response.status == "incomplete"  # min = max tokens: stops at max_output_tokens
    assert [i.role for i in session.conversation.items] == ["user", "assistant"]
    assert item.content[0].transcript == item.ledger.transcript != ""  # all of it was played
    for m in media:  # protocol-exact: 20 ms frames of u-law, nothing else
        payload = m["media"]["payload"]
        assert m == {"event": "media", "streamSid": carrier.stream_sid, "media": {"payload": payload}}
        assert len(base64.b64decode(m["media"]["payload"])) == FRAME
    assert generated <= len(carrier.audio()) < generated + FRAME  # the last frame padded with silence
    assert abs(generated - 12 * BYTES_PER_CODEC_FRAME) < BYTES_PER_CODEC_FRAME  # 12 codec frames at 8 kHz
    assert {tuple(m) for m in marks} == {("event", "streamSid", "mark")} and len(marks) >= 6
    # paced: frames arrive at real-time pace, at most ~200 ms ahead of playback
    span = carrier.time_of(last) - carrier.time_of(first)
    assert span >= generated / 8000 - 0.2 - 0.1, span
    t0 = carrier.time_of(first)
    for t, m in carrier.messages:
        if m["event"] == "media":
            ahead = len(carrier.audio(before=m)) / 8000 - (t - t0)
            assert ahead < 0.2 + 0.1, ahead


async def test_barge_in_clears_cancels_and_truncates_at_the_echoed_marks(
    server: ServerThread, voice: dict[str, bytes]
) -> None:
    engine = server.server.config.app.state.lifecycle.engine
    async with call(server.base_url) as carrier:
        await carrier.connected()
        await carrier.start(**fixed_call(24, 150))  # 12 s of audio: still playing when the caller interrupts
        await carrier.play(voice["one"])
        await carrier.next("media", timeout=60)
        # the carrier holds audio past the 4th mark (up to the 5th at least) when the caller speaks: a
        # carrier that has played all it was sent has nothing to clear
        await until(lambda: len(carrier.of("mark")) >= 5, 20)
        heard_mark = carrier.of("mark")[3]
        await echo_marks(carrier, 4)  # the caller heard up to the 4th mark, and no further
        heard = len(carrier.audio(before=heard_mark))
        session = the_session(server)
        first = session.response
        t_speech = time.monotonic()
        await carrier.play(voice["stop"], pace=1.0)
        clear = await carrier.next("clear", timeout=5)
        assert clear == {"event": "clear", "streamSid": carrier.stream_sid}
        assert carrier.time_of(clear) - t_speech < 1.5
        await echo_marks(carrier)  # on clear, the carrier echoes the pending marks too: not played
        await until(lambda: first.status != "in_progress", 20)
        sent_before_clear = len(carrier.audio(before=clear))
        await until(lambda: len(session.conversation.items) >= 4, timeout=30)  # the next turn answers
        await carrier.stop()
        await until(lambda: not engine.stats().active_requests, 20)
    assert first.status == "cancelled" and first.status_details["reason"] == "turn_detected"
    item = first.item
    assert abs(item.ledger.sent - heard) < FRAME  # played = the deltas closed by the echoed marks
    kept, full = item.content[0].transcript, item.ledger.transcript
    assert kept == item.ledger.heard_transcript(item.ledger.sent_ms) and len(kept) < len(full)
    assert sent_before_clear / 8000 < 12 * 0.5  # paced: most of the 12 s never left the server
    assert [i.role for i in session.conversation.items][:3] == ["user", "assistant", "user"]


async def test_barge_in_after_the_answer_was_generated_truncates_what_was_not_heard(
    server: ServerThread, voice: dict[str, bytes]
) -> None:
    async with call(server.base_url) as carrier:
        await carrier.connected()
        await carrier.start(**fixed_call(12, 24))  # ~1.9 s of audio: generated well before it has played
        await carrier.play(voice["one"])
        await carrier.next("media", timeout=60)
        session = the_session(server)
        await until(lambda: session.last_response is not None and session.response is None, 20)
        # taken now: by the time the barge-in's speech has been played, the next turn's response may
        # have ended too and be the session's last
        answer = session.last_response
        await until(lambda: len(carrier.of("mark")) >= 2, 20)
        await echo_marks(carrier, 2)
        heard = len(carrier.audio(before=carrier.of("mark")[1]))
        await carrier.play(voice["stop"], pace=1.0)
        await carrier.next("clear", timeout=5)
        await echo_marks(carrier)  # the dropped marks come back: not played
        await until(lambda: session.response is not None or len(session.conversation.items) >= 3, 20)
        await carrier.stop()
    assert answer.status == "incomplete"  # it ran to its end; only its playout was cut
    ledger = answer.item.ledger
    assert ledger.complete and abs(ledger.sent - heard) < FRAME
    kept = answer.item.content[0].transcript
    assert kept == ledger.heard_transcript(ledger.sent_ms) and len(kept) < len(ledger.transcript)


@pytest.mark.parametrize("ending", ["stop", "disconnect"])
async def test_stop_or_disconnect_frees_the_session_in_every_stage(
    server: ServerThread, voice: dict[str, bytes], ending: str
) -> None:
    app = server.server.config.app
    engine = app.state.lifecycle.engine
    async with call(server.base_url) as carrier:
        await carrier.connected()
        await carrier.start(**fixed_call(24, 150))
        await carrier.play(voice["one"])
        await carrier.next("media", timeout=60)
        assert engine.stats().active_requests == 1
        if ending == "stop":
            await carrier.stop()
            await asyncio.wait_for(carrier.closed.wait(), 5)  # the server hangs up
            assert carrier.ws.close_code == 1000
    await until(lambda: _idle(engine, app), 10, "the engine and the sessions left idle")
    assert app.state.admission.in_flight == 0


async def test_malformed_frames_are_logged_and_the_call_goes_on(
    server: ServerThread, voice: dict[str, bytes], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="omnivoice.server.telephony")
    async with call(server.base_url) as carrier:
        sid = carrier.stream_sid
        await carrier.connected()
        await carrier.media(bytes(FRAME))  # media before start
        await carrier.start(**fixed_call(4, 6))
        bad = [
            "{not json",
            '["media"]',
            '{"event": "ring"}',
            json.dumps({"event": "media", "streamSid": sid, "media": {"track": "inbound"}}),
        ]
        for text in bad:
            await carrier.ws.send(text)
        await carrier.ws.send(b"\x00\x01")  # binary
        await carrier.media("not base64!")
        await carrier.media(b"")  # empty payload
        await carrier.media(bytes(4000))  # 500 ms in one frame
        await carrier.send({"event": "media", "streamSid": "MZother", "media": {"payload": "//8="}})
        await carrier.mark("never-sent")  # not ours: ignored quietly
        await carrier.dtmf("7")
        await carrier.play(voice["one"])
        await carrier.next("media", timeout=60)  # the call still answers
        session = the_session(server)
    sessions = server.server.config.app.state.realtime.sessions
    await until(lambda: session.id not in sessions, 20)  # the call ended with the socket
    malformed = [r.getMessage() for r in caplog.records if "malformed frame dropped" in r.getMessage()]
    assert len(malformed) == 10, malformed
    assert all(sid in m for m in malformed[1:]) and "before start" in malformed[0]
    for needle in ("not valid JSON", "JSON object", "unknown event 'ring'", "media.payload", "binary",
                   "base64", "0 bytes", "4000 bytes", "another stream"):  # fmt: skip
        assert any(needle in m for m in malformed), needle
    assert any("DTMF '7'" in r.getMessage() for r in caplog.records)
