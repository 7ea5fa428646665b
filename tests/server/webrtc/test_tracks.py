"""The call's media tracks without a network: server-side playout (pacing, played-audio accounting,
output_audio_buffer events, clearing) and decoded frames to mono."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from av import AudioFrame

from omnivoice.server.webrtc.tracks import FRAME, RATE, PlayoutTrack, frame_to_mono


def track() -> tuple[PlayoutTrack, list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    return PlayoutTrack(events.append), events


def samples(frame: AudioFrame) -> np.ndarray:
    return frame.to_ndarray().reshape(-1)


async def test_audio_is_played_in_20ms_frames_then_silence() -> None:
    t, events = track()
    played: list[int] = []
    tone = np.full(1200, 0.5, np.float32)  # 50 ms at 24 kHz
    t.play("resp_1", "item_1", tone, 24000, lambda: played.append(1))
    t.finish("resp_1")
    t0 = time.monotonic()
    frames = [await t.recv() for _ in range(10)]
    elapsed = time.monotonic() - t0
    assert elapsed >= 0.17  # paced: one frame per 20 ms (the first at once), never a burst
    assert all(f.samples == FRAME and f.sample_rate == RATE for f in frames)
    assert [f.pts for f in frames] == [i * FRAME for i in range(10)]
    loud = [int(np.abs(samples(f)).max() > 8000) for f in frames]
    assert loud[:2] == [1, 1] and sum(loud) == 3 and not any(loud[4:])  # 50 ms + resampler tail
    assert played == [1]
    assert [e["type"] for e in events] == ["output_audio_buffer.started", "output_audio_buffer.stopped"]
    assert all(e["response_id"] == "resp_1" for e in events)
    assert t.audio_frames_sent == 3 and t.frames_sent == 10


async def test_stopped_waits_for_the_response_to_end() -> None:
    t, events = track()
    t.play("resp_1", "item_1", np.full(960, 0.5, np.float32), 48000, None)
    for _ in range(3):
        await t.recv()
    assert [e["type"] for e in events] == ["output_audio_buffer.started"]  # more may come
    t.finish("resp_1")
    assert [e["type"] for e in events][-1] == "output_audio_buffer.stopped"


async def test_clear_drops_queued_audio_and_later_audio_of_the_response() -> None:
    t, events = track()
    played: list[int] = []
    for _ in range(5):
        t.play("resp_1", "item_1", np.full(4800, 0.5, np.float32), 24000, lambda: played.append(1))
    await t.recv()
    assert t.queued_ms > 900
    assert t.clear("resp_1") == "item_1"
    assert t.queued_ms == 0 and played == []
    t.play("resp_1", "item_1", np.full(4800, 0.5, np.float32), 24000, None)  # late: dropped
    assert t.queued_ms == 0
    frame = await t.recv()
    assert not np.abs(samples(frame)).any()
    assert [e["type"] for e in events] == ["output_audio_buffer.started", "output_audio_buffer.cleared"]
    assert t.clear(None) is None  # nothing playing: no event
    assert len(events) == 2
    t.play("resp_2", "item_2", np.full(480, 0.5, np.float32), 24000, None)  # the next response plays
    await t.recv()
    assert events[-1] == {"type": "output_audio_buffer.started", "response_id": "resp_2"}


def test_frames_to_mono() -> None:
    stereo = AudioFrame.from_ndarray(
        np.array([[16384, -16384, 8192, 8192]], np.int16), format="s16", layout="stereo"
    )
    assert np.allclose(frame_to_mono(stereo), [0.0, 0.25])
    planar = AudioFrame.from_ndarray(
        np.array([[0.5, 0.5], [0.1, -0.5]], np.float32), format="fltp", layout="stereo"
    )
    assert np.allclose(frame_to_mono(planar), [0.3, 0.0])


async def test_back_to_back_responses_stop_then_start() -> None:
    t, events = track()
    t.play("resp_1", "item_1", np.full(960, 0.5, np.float32), 48000, None)
    t.finish("resp_1")
    t.play("resp_2", "item_2", np.full(960, 0.5, np.float32), 48000, None)  # queued behind resp_1
    t.finish("resp_2")
    for _ in range(3):
        await t.recv()
    assert [(e["type"], e["response_id"]) for e in events] == [
        ("output_audio_buffer.started", "resp_1"),
        ("output_audio_buffer.stopped", "resp_1"),
        ("output_audio_buffer.started", "resp_2"),
        ("output_audio_buffer.stopped", "resp_2"),
    ]
    t.finish("resp_3")  # a response without audio: no events
    assert len(events) == 4
