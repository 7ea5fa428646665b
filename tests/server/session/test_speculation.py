"""Speculative responses end to end: the tiny model (thread workers) behind a real server, espeak-ng
speech over the `openai` SDK's realtime client with server VAD. A turn's response starts when the speech
pauses and is held until the silence window confirms the turn; speech before then drops it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from omnivoice.types import AudioPart, TextDelta
from tests.support.polling import until
from tests.support.realtime_client import Recorder, client, send_audio
from tests.support.serve import ServerThread, serve_tiny
from tests.support.speech import RATE, fixed, pcm16, speak

pytestmark = pytest.mark.slow

COUNTS = ("started", "confirmed", "dropped", "wasted_tokens", "wasted_audio_seconds")
TURN = [
    "input_audio_buffer.speech_started",
    "input_audio_buffer.speech_stopped",
    "input_audio_buffer.committed",
    "conversation.item.added",
    "conversation.item.done",
    "response.created",
    "response.output_item.added",
    "conversation.item.added",
    "response.content_part.added",
    "response.output_audio.done",
    "response.output_audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
]


@pytest.fixture(scope="module")
def server(tiny_checkpoint: Path) -> Iterator[ServerThread]:
    with serve_tiny(tiny_checkpoint) as st:
        yield st


def _trimmed(pcm: np.ndarray) -> np.ndarray:
    """Without espeak-ng's leading and trailing silence: the clip is all speech."""
    loud = np.flatnonzero(np.abs(pcm) > 0.01)
    return pcm[loud[0] : loud[-1] + 1]


@pytest.fixture(scope="module")
def voice(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    folder = tmp_path_factory.mktemp("speech")
    return {
        "hello": _trimmed(speak("Hello there.", folder)),
        "story": _trimmed(speak("Tell me a story.", folder)),
    }


def _state(server: ServerThread) -> dict[str, Any]:
    return httpx.get(f"{server.base_url}/v1/debug/state", timeout=10).json()


def _counts(server: ServerThread) -> dict[str, float]:
    return _state(server)["speculative_responses"]


def _since(before: dict[str, float], server: ServerThread) -> dict[str, float]:
    after = _counts(server)
    return {k: after[k] - before[k] for k in COUNTS}


def _engine_idle(server: ServerThread) -> bool:
    stats = server.server.config.app.state.lifecycle.engine.stats()
    return not stats.active_requests and all(s.running == s.queued == 0 for s in stats.stages)


def _turn_events(rec: Recorder) -> list[str]:
    return [t for t in rec.types() if not t.endswith(".delta") and not t.startswith("session.")]


def _response_ids(rec: Recorder) -> set[str]:
    ids = set()
    for _, e in rec.events:
        response = getattr(e, "response", None)
        ids |= {response.id} if response is not None else set()
        ids |= {e.response_id} if getattr(e, "response_id", None) else set()
    return ids


async def test_speech_after_a_pause_drops_the_speculative_response(
    server: ServerThread, voice: dict[str, np.ndarray]
) -> None:
    before = _counts(server)
    async with client(server.base_url).realtime.connect(model="omnivoice") as conn:
        rec = Recorder(conn)
        sid = (await rec.next("session.created")).session.id
        session = server.server.config.app.state.realtime.sessions[sid]
        await conn.session.update(session=fixed(6, 12))
        await rec.next("session.updated")
        # a pause shorter than the 500 ms silence window: the response starts, and is held
        await send_audio(conn, pcm16(0.5, voice["hello"], 0.25))
        await until(lambda: session.speculation is not None, 30, "a speculative response started")
        spec = session.speculation
        await until(lambda: any(isinstance(o, TextDelta) for o in spec.held), 30, "it generated text")
        assert not any(t.startswith("response.") for t in rec.types())
        held = sum(len(o.token_ids) for o in spec.held if isinstance(o, TextDelta))
        # the caller goes on: the held response is dropped, aborted in every stage, and never heard of
        await send_audio(conn, pcm16(voice["story"]))
        await until(lambda: session.speculation is None and _engine_idle(server), 30, "the drop aborted it")
        assert _state(server)["engine"]["live_requests"] == 0
        assert not any(t.startswith("response.") for t in rec.types())
        dropped = _since(before, server)
        assert dropped["dropped"] >= 1 and dropped["confirmed"] == 0
        assert dropped["wasted_tokens"] >= held
        # the silence that ends the turn: one response, to the whole utterance
        await send_audio(conn, pcm16(1.0))
        done = await rec.next("response.done", timeout=60)
        committed = next(e for _, e in rec.events if e.type == "input_audio_buffer.committed")
        item = session.conversation.get(committed.item_id)
        prompt = session.last_response.messages
        await rec.close()
    assert rec.types().count("response.created") == 1
    assert _response_ids(rec) == {done.response.id}
    assert done.response.status == "incomplete"  # 6 tokens: min = max
    counts = _since(before, server)
    assert counts["confirmed"] == 1 and counts["started"] == counts["confirmed"] + counts["dropped"]
    spoken = (voice["hello"].size + voice["story"].size) / RATE + 0.25
    assert spoken < item.audio_seconds < spoken + 0.3 + 0.2  # prefix padding, the VAD's lag
    audio = prompt[-1].parts[0]
    assert isinstance(audio, AudioPart) and audio.pcm is item.content[0].audio  # what the model heard
    await until(lambda: _engine_idle(server), 10, "the engine idle")


async def test_a_confirmed_response_keeps_the_protocol_order(
    server: ServerThread, voice: dict[str, np.ndarray]
) -> None:
    before = _counts(server)
    async with client(server.base_url).realtime.connect(model="omnivoice") as conn:
        rec = Recorder(conn)
        sid = (await rec.next("session.created")).session.id
        await conn.session.update(session=fixed(6, 12))
        await send_audio(conn, pcm16(0.5, voice["story"], 1.0))
        done = await rec.next("response.done", timeout=60)
        session = server.server.config.app.state.realtime.sessions[sid]
        item = session.conversation.items[0]
        started = next(e for _, e in rec.events if e.type == "input_audio_buffer.speech_started")
        stopped = next(e for _, e in rec.events if e.type == "input_audio_buffer.speech_stopped")
        prompt = session.last_response.messages
        await rec.close()
    order = [
        t for t in rec.types() if not t.endswith(".delta") and t not in ("session.created", "session.updated")
    ]
    assert order == TURN
    assert _response_ids(rec) == {done.response.id} and len(rec.audio()) > 0
    counts = _since(before, server)
    assert counts["confirmed"] == 1 and counts["started"] == 1 + counts["dropped"]
    # the item is the audio the response was prompted with: the turn up to where the speech paused,
    # without the silence window that confirmed it
    assert prompt[-1].parts[0].pcm is item.content[0].audio
    left_out = (stopped.audio_end_ms - started.audio_start_ms) / 1000 - item.audio_seconds
    assert 0.47 < left_out < 0.6  # 15 frames of 32 ms, and any between the thresholds


async def test_with_the_setting_off_the_response_starts_once_the_turn_ends(
    server: ServerThread, voice: dict[str, np.ndarray]
) -> None:
    before = _counts(server)
    settings = fixed(6, 12)
    settings["omnivoice"]["speculative_response"] = False
    async with client(server.base_url).realtime.connect(model="omnivoice") as conn:
        rec = Recorder(conn)
        sid = (await rec.next("session.created")).session.id
        await conn.session.update(session=settings)
        await send_audio(conn, pcm16(0.5, voice["hello"], 0.25, voice["story"], 1.0))
        done = await rec.next("response.done", timeout=60)
        session = server.server.config.app.state.realtime.sessions[sid]
        item = session.conversation.items[0]
        started = next(e for _, e in rec.events if e.type == "input_audio_buffer.speech_started")
        stopped = next(e for _, e in rec.events if e.type == "input_audio_buffer.speech_stopped")
        await rec.close()
    order = [
        t for t in rec.types() if not t.endswith(".delta") and t not in ("session.created", "session.updated")
    ]
    assert order == TURN and _response_ids(rec) == {done.response.id}
    assert _since(before, server) == dict.fromkeys(COUNTS, 0)
    held_ms = 1000 * item.audio_seconds  # as before: the turn's audio up to speech_stopped
    assert abs(held_ms - (stopped.audio_end_ms - started.audio_start_ms)) < 40


async def test_metrics_export_the_counts(server: ServerThread) -> None:
    counts = _counts(server)
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    for key in COUNTS:
        assert f"omnivoice_realtime_speculative_{key}_total {float(counts[key])}" in text
