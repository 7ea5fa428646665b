"""semantic_vad end to end: the tiny model behind a real server, the end-of-turn model (Smart Turn)
deciding at each pause of the benchmark's espeak-ng questions, over the `openai` SDK's realtime
client (GA), a raw WebSocket with the beta names, and a Twilio call (8 kHz u-law).

The clips were picked by their saved scores (tests/audio/smart_turn_reference.json): "Please set an
alarm for seven in the morning." scores "done" far above every eagerness's bar; "What is the best way
to ... learn a new language?" scores far below every bar at its pause and at its end. Decisions are
made in the audio's order (the session waits for the score before it reads on), so what a test sends
decides the outcome, however fast the machine: a turn given less silence than its ceiling can only
have been ended by the model."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from omnivoice.server.session.end_of_turn import JudgeStats
from omnivoice.server.session.session_config import SEMANTIC_EAGERNESS
from omnivoice.types import AudioPart
from tests.support.realtime_client import Recorder, client, send_audio
from tests.support.serve import ServerThread, serve_tiny
from tests.support.speech import RATE, fixed, fixed_call, pcm16
from tests.support.turn_clips import clip, manifest
from tests.support.twilio_carrier import call, ulaw

pytestmark = pytest.mark.slow

DONE = "complete/02.wav"  # scores ~0.98 at its end
HELD = "broken/02.wav"  # scores < 0.5 at its pause and at its end
LEAD_S = 0.5  # silence before the speech
TURN = [
    "input_audio_buffer.speech_started",
    "input_audio_buffer.speech_stopped",
    "input_audio_buffer.committed",
    "conversation.item.added",
    "conversation.item.done",
    "response.created",
]


@pytest.fixture(scope="module")
def server(tiny_checkpoint: Path) -> Iterator[ServerThread]:
    with serve_tiny(tiny_checkpoint) as st:
        yield st


def _judge(server: ServerThread) -> JudgeStats:
    return server.server.config.app.state.realtime.judge.stats


def _semantic(eagerness: str) -> dict[str, Any]:
    td = {"type": "semantic_vad", "eagerness": eagerness}
    return fixed(6, 12, audio={"input": {"turn_detection": td}})


def _turn_events(rec: Recorder) -> list[str]:
    skip = ("session.created", "session.updated")
    return [t for t in rec.types() if not t.endswith(".delta") and t not in skip]


async def test_a_complete_question_ends_at_its_pause_not_at_the_ceiling(server: ServerThread) -> None:
    stats, speculation = _judge(server), server.server.config.app.state.realtime.speculation
    done_before, confirmed_before = stats.done, speculation.confirmed
    speech = clip(DONE, RATE)
    ceiling_ms = SEMANTIC_EAGERNESS["low"].ceiling_ms
    async with client(server.base_url).realtime.connect(model="omnivoice") as conn:
        rec = Recorder(conn)
        await rec.next("session.created")
        await conn.session.update(session=_semantic("low"))
        updated = await rec.next("session.updated")
        # half the ceiling's silence after the speech: only the model can end this turn
        await send_audio(conn, pcm16(LEAD_S, speech, ceiling_ms / 2000))
        await rec.next("response.done", timeout=60)
        stopped = next(e for _, e in rec.events if e.type == "input_audio_buffer.speech_stopped")
        await rec.close()
    td = updated.session.audio.input.turn_detection
    assert td.type == "semantic_vad" and td.eagerness == "low"
    assert _turn_events(rec)[: len(TURN)] == TURN  # the events OpenAI sends when a turn ends
    assert _turn_events(rec).count("input_audio_buffer.speech_stopped") == 1
    speech_end_ms = 1000 * (LEAD_S + speech.size / RATE)
    assert 0 < stopped.audio_end_ms - speech_end_ms < ceiling_ms / 2
    assert stats.done > done_before
    assert speculation.confirmed > confirmed_before  # the response started at the pause answered it


async def test_a_pause_held_open_leaves_no_trace_when_the_caller_goes_on(server: ServerThread) -> None:
    stats, app = _judge(server), server.server.config.app
    held_before = stats.held
    dropped_before = app.state.realtime.speculation.dropped
    speech, pause = clip(HELD, RATE), manifest(HELD)["pause"]
    ceiling_s = SEMANTIC_EAGERNESS["medium"].ceiling_ms / 1000
    assert (pause[1] - pause[0]) / 16000 < ceiling_s  # the pause alone never reaches the ceiling
    async with client(server.base_url).realtime.connect(model="omnivoice") as conn:
        rec = Recorder(conn)
        sid = (await rec.next("session.created")).session.id
        await conn.session.update(session=_semantic("medium"))
        await rec.next("session.updated")
        await send_audio(conn, pcm16(LEAD_S, speech, ceiling_s + 0.5))
        await rec.next("response.done", timeout=60)
        session = app.state.realtime.sessions[sid]
        stopped = next(e for _, e in rec.events if e.type == "input_audio_buffer.speech_stopped")
        prompt = session.last_response.messages
        users = [i for i in session.conversation.items if i.role == "user"]
        await rec.close()
    events = _turn_events(rec)
    assert events[: len(TURN)] == TURN
    once = [k for k in TURN if k.startswith("input_audio_buffer.")] + ["response.created", "response.done"]
    for kind in once:  # one turn, one response: the pause left nothing behind
        assert events.count(kind) == 1, kind
    assert stopped.audio_end_ms > 1000 * LEAD_S + pause[1] / 16  # the turn ended after the resumption
    (item,) = users
    assert item.audio_seconds > speech.size / RATE  # the whole question, the pause inside it
    audio = prompt[-1].parts[0]
    assert isinstance(audio, AudioPart) and audio.pcm is item.content[0].audio  # what the model heard
    assert stats.held >= held_before + 2  # the pause, and the end (the ceiling ended the turn)
    assert app.state.realtime.speculation.dropped > dropped_before  # started at the pause, dropped


@pytest.mark.parametrize("eagerness", ["medium", "high"])
async def test_a_turn_the_model_holds_ends_at_its_eagerness_ceiling(
    server: ServerThread, eagerness: str
) -> None:
    head = clip(HELD, RATE)[: manifest(HELD)["pause"][0] * RATE // 16000]  # "What is the best way to"
    ceiling_ms = SEMANTIC_EAGERNESS[eagerness].ceiling_ms
    async with client(server.base_url).realtime.connect(model="omnivoice") as conn:
        rec = Recorder(conn)
        await rec.next("session.created")
        await conn.session.update(session=_semantic(eagerness))
        await send_audio(conn, pcm16(LEAD_S, head, ceiling_ms / 1000 + 0.5))
        await rec.next("response.done", timeout=60)
        stopped = next(e for _, e in rec.events if e.type == "input_audio_buffer.speech_stopped")
        await rec.close()
    silence_ms = stopped.audio_end_ms - 1000 * (LEAD_S + head.size / RATE)
    assert ceiling_ms <= silence_ms < ceiling_ms + 200  # whole 32 ms frames, the VAD's hysteresis


async def test_beta_names(server: ServerThread) -> None:
    url = server.base_url.replace("http", "ws", 1) + "/v1/realtime?model=omnivoice"
    headers = {"OpenAI-Beta": "realtime=v1"}
    session = {"turn_detection": {"type": "semantic_vad", "eagerness": "low"}, **fixed(6, 12)}
    session.pop("type")
    ceiling_s = SEMANTIC_EAGERNESS["low"].ceiling_ms / 1000
    audio = pcm16(LEAD_S, clip(DONE, RATE), ceiling_s / 2)
    seen: list[dict[str, Any]] = []
    async with websockets.connect(url, additional_headers=headers, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.update", "session": session}))
        step = RATE * 2 // 50
        for i in range(0, len(audio), step):
            chunk = base64.b64encode(audio[i : i + step]).decode()
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
        while not seen or seen[-1]["type"] != "response.done":
            seen.append(json.loads(await ws.recv()))
            assert seen[-1]["type"] != "error", seen[-1]
    updated = next(e for e in seen if e["type"] == "session.updated")["session"]
    assert updated["turn_detection"]["type"] == "semantic_vad"
    assert updated["turn_detection"]["eagerness"] == "low"
    types = [e["type"] for e in seen]
    assert types.count("input_audio_buffer.speech_stopped") == 1
    assert "response.audio.delta" in types and "response.output_audio.delta" not in types


async def test_a_twilio_call_ends_turns_through_the_model(server: ServerThread) -> None:
    stats = _judge(server)
    done_before = stats.done
    ceiling_s = SEMANTIC_EAGERNESS["low"].ceiling_ms / 1000
    async with call(server.base_url) as carrier:
        await carrier.connected()
        await carrier.start(**fixed_call(6, 12, turn_detection="semantic_vad", eagerness="low"))
        # 8 kHz u-law, resampled to 16 kHz for the VAD and the model; less silence than the ceiling
        await carrier.play(ulaw(LEAD_S, clip(DONE, RATE), ceiling_s / 2))
        await carrier.next("media", timeout=60)
        (session,) = server.server.config.app.state.realtime.sessions.values()
        td = session.settings.turn_detection
        users = [i for i in session.conversation.items if i.role == "user"]
    assert td.type == "semantic_vad" and td.eagerness == "low"
    assert len(users) == 1 and stats.done > done_before


async def test_metrics_time_every_pause(server: ServerThread) -> None:
    stats = _judge(server)
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    assert f"omnivoice_turn_model_pause_seconds_count {float(stats.pauses)}" in text
    assert stats.pauses >= 1 and f"omnivoice_turn_model_done_total {float(stats.done)}" in text
