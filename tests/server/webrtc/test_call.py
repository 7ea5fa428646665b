"""End to end over WebRTC with aiortc as the client peer: the tiny model (thread workers) behind a
real server; espeak-ng speech on the client's microphone track; the assistant's audio back on the
remote track; Realtime events on the `oai-events` data channel. Covers the audio round trip, the
server-owned playout events, barge-in clearing the queued audio, hang-up and the ICE timeout."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection

from tests.support.polling import until
from tests.support.serve import ServerThread, serve_tiny
from tests.support.speech import fixed, speak
from tests.support.webrtc_client import RATE, ClientCall, connect

pytestmark = pytest.mark.slow

FRAME_MS = 80  # one talker frame


@pytest.fixture(scope="module")
def server(tiny_checkpoint: Path) -> Iterator[ServerThread]:
    with serve_tiny(tiny_checkpoint) as st:
        yield st


@pytest.fixture(scope="module")
def voice(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[np.ndarray, int]]:
    folder = tmp_path_factory.mktemp("speech")
    return {
        "one": (speak("Hello there. Could you tell me a short story about the sea?", folder, RATE), RATE),
        "stop": (speak("Wait, stop, stop please.", folder, RATE), RATE),
    }


def say(call: ClientCall, speech: tuple[np.ndarray, int], lead_s: float = 0.3, tail_s: float = 0.9) -> None:
    pcm, rate = speech
    silence = np.zeros(int(lead_s * rate), np.float32)
    call.mic.say(np.concatenate([silence, pcm, np.zeros(int(tail_s * rate), np.float32)]), rate)


async def secret(server: ServerThread, session: dict[str, Any]) -> str:
    async with httpx.AsyncClient() as http:
        r = await http.post(f"{server.base_url}/v1/realtime/client_secrets", json={"session": session})
    assert r.status_code == 200, r.text
    return r.json()["value"]


def released(server: ServerThread) -> bool:
    """No call, session, session slot, admitted request or engine request is left."""
    state = server.server.config.app.state
    stats = state.lifecycle.engine.stats()
    left = (state.webrtc.calls, state.realtime.sessions, state.realtime.reserved, stats.active_requests)
    return not any(left) and state.admission.in_flight == 0


async def test_spoken_turn_round_trip(server: ServerThread, voice: dict[str, Any]) -> None:
    token = await secret(server, fixed(6, 12, instructions="Be brief."))
    door = server.server.config.app.state.realtime.front_door  # the app's: the call's audio goes through it
    jobs = door.jobs
    call = await connect(server.base_url, token)
    try:
        created = await call.next("session.created")
        assert created["session"]["max_output_tokens"] == 6  # the client secret's settings
        assert created["session"]["instructions"] == "Be brief."
        say(call, voice["one"])
        started = await call.next("input_audio_buffer.speech_started")
        stopped = await call.next("input_audio_buffer.speech_stopped")
        assert door.workers >= 1 and door.jobs - jobs >= 50  # 20 ms frames of a few seconds of speech
        committed = await call.next("input_audio_buffer.committed")
        # a short answer can be done before its playback starts: no order between these two
        playing = await call.first("output_audio_buffer.started", timeout=60)
        done = await call.next("response.done", timeout=60)
        drained = await call.next("output_audio_buffer.stopped", timeout=30)
        await asyncio.sleep(0.3)  # the last frames in flight
    finally:
        await call.close()
    assert started["item_id"] == stopped["item_id"] == committed["item_id"]
    rid = done["response"]["id"]
    assert playing["response_id"] == drained["response_id"] == rid
    assert done["response"]["status"] == "incomplete"  # min = max tokens
    types = call.types()
    assert "response.output_audio.delta" not in types  # audio rides the track, not the channel
    assert types.index("response.done") < types.index("output_audio_buffer.stopped")
    assert types.count("response.output_audio_transcript.delta") >= 1
    # the round trip: 12 frames of the model's audio arrived as Opus on the remote track
    t_stop = call.time_of(stopped)
    heard = call.audible_ms(since=t_stop)
    assert abs(heard - 12 * FRAME_MS) <= 300, heard
    first = next(t for t, rms in call.frames if t > t_stop and rms > 1e-3)
    assert first - t_stop < 5.0
    assert call.time_of(drained) - call.time_of(playing) > 0.6  # paced in real time, not in a burst
    await until(lambda: released(server), 10, "the call released")


async def test_barge_in_clears_queued_audio(server: ServerThread, voice: dict[str, Any]) -> None:
    state = server.server.config.app.state
    call = await connect(server.base_url)
    try:
        sid = (await call.next("session.created"))["session"]["id"]
        call.send({"type": "session.update", "session": fixed(24, 150)})  # 12 s of audio
        await call.next("session.updated")
        say(call, voice["one"])
        first = await call.next("response.created", timeout=30)
        rid = first["response"]["id"]
        await call.next("output_audio_buffer.started", timeout=30)
        await asyncio.sleep(0.8)
        say(call, voice["stop"], lead_s=0.0)
        barge = await call.next("input_audio_buffer.speech_started")
        cleared = await call.next("output_audio_buffer.cleared")
        done = await call.next("response.done")
        barge_end = await call.next("input_audio_buffer.speech_stopped")
        t_cleared = call.time_of(cleared)
        session = state.realtime.sessions[sid]
        item = session.conversation.get(done["response"]["output"][0]["id"])
        # the interrupted reply keeps what was played: the server counted playout, not generation
        ledger = item.ledger
        assert 0 < ledger.sent_ms < 12_000 and ledger.sent <= ledger.generated  # on a busy CPU, all of it
        assert item.content[0].transcript == ledger.heard_transcript(ledger.sent_ms)
        # the next turn's response; the client cuts it off by hand (output_audio_buffer.clear)
        second = await call.next("response.created", timeout=30)
        await call.next("output_audio_buffer.started", timeout=30)
        t_second = call.time_of(second)
        call.send({"type": "response.cancel"})
        call.send({"type": "output_audio_buffer.clear"})
        cancelled = await call.next("response.done")
        cleared2 = await call.next("output_audio_buffer.cleared")
    finally:
        await call.close()
    assert cleared["response_id"] == done["response"]["id"] == rid
    assert done["response"]["status"] == "cancelled"
    assert done["response"]["status_details"]["reason"] == "turn_detected"
    assert call.time_of(barge) <= t_cleared < call.time_of(barge_end)  # cleared while the caller speaks
    # after the clear, silence on the track until the next response plays (a jitter buffer and a busy
    # client may still hand over frames sent before the clear for a while)
    assert call.audible_ms(since=t_cleared + 1.0, until=t_second) <= 60
    heard = call.audible_ms(until=t_cleared + 1.0)
    assert abs(heard - ledger.sent_ms) < 1000, (heard, ledger.sent_ms)
    assert cancelled["response"]["id"] == cleared2["response_id"] == second["response"]["id"]
    assert cancelled["response"]["status_details"]["reason"] == "client_cancelled"
    await until(lambda: released(server), 10, "the call released")


async def test_hang_up_releases_the_call(server: ServerThread, voice: dict[str, Any]) -> None:
    call = await connect(server.base_url)
    try:
        await call.next("session.created")
        call.send({"type": "session.update", "session": fixed(24, 150)})
        say(call, voice["one"])
        await call.next("output_audio_buffer.started", timeout=30)
        url = f"{server.base_url}/v1/realtime/calls/{call.call_id}/hangup"
        async with httpx.AsyncClient() as http:
            assert (await http.post(url)).status_code == 200
            # the response was aborted in every stage
            await until(lambda: released(server), 10, "the call released")
            again = await http.post(url)
    finally:
        await call.close()
    assert again.status_code == 404


async def test_closing_the_channel_mid_answer_is_a_hang_up(
    server: ServerThread, voice: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """As the page stops a call: its data channel closes while the answer's events still go out."""
    call = await connect(server.base_url)
    try:
        await call.next("session.created")
        call.send({"type": "session.update", "session": fixed(24, 150)})
        say(call, voice["one"])
        await call.next("output_audio_buffer.started", timeout=30)
        with caplog.at_level(logging.DEBUG, logger="omnivoice.server.webrtc"):
            call.channel.close()
            await call.pc.close()  # as the page does
            await until(lambda: released(server), 10, "the call released")
    finally:
        await call.close()
    records = [r for r in caplog.records if r.name.startswith("omnivoice.server.webrtc")]
    assert not [r.getMessage() for r in records if r.levelno >= logging.WARNING]
    closed = [r.getMessage() for r in records if r.getMessage().endswith("closed: data channel closed")]
    assert len(closed) == 1 and not [r for r in records if "failed" in r.getMessage()]


async def test_a_call_that_never_connects_times_out(server: ServerThread) -> None:
    calls = server.server.config.app.state.webrtc
    calls.connect_timeout_s = 1.0
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        pc.addTransceiver("audio")
        pc.createDataChannel("oai-events")
        await pc.setLocalDescription(await pc.createOffer())
        async with httpx.AsyncClient() as http:
            r = await http.post(
                f"{server.base_url}/v1/realtime/calls",
                content=pc.localDescription.sdp,
                headers={"Content-Type": "application/sdp"},
            )
        assert r.status_code == 201  # the answer is never applied: ICE cannot complete
        assert calls.calls
        await until(lambda: released(server), 10, "the call released")
    finally:
        calls.connect_timeout_s = 15.0
        await pc.close()
