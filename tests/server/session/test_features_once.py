"""A conversation's audio is featurized once: each clip's log-mel frames are computed a single time
over several turns, the early prefill at each speech start and a history truncated to fit the context;
a spoken turn is featurized while it is spoken, and its whole encoder windows are sent ahead."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import numpy as np

from omnivoice.types import AudioPart
from tests.support.fake_engine import serve_realtime
from tests.support.realtime_client import Recorder, client, send_audio
from tests.support.speech import pcm16, speak

WINDOW = 100  # frames of the fake model's encoder window here (1 s), so a spoken turn has several


def audio_item(seconds: float, seed: int) -> dict[str, Any]:
    noise = 0.1 * np.random.default_rng(seed).standard_normal(int(seconds * 24000))
    audio = base64.b64encode(pcm16(noise.astype(np.float32))).decode()
    return {"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": audio}]}


async def test_each_clip_is_featurized_once_across_turns_and_truncation(tmp_path: Path) -> None:
    speech = speak("Hello there, this is a test of the features of a spoken turn.", tmp_path)
    # no speculative responses: each would featurize the end of the turn so far once more, at a pause
    with serve_realtime(audio_window_frames=WINDOW, speculative_response=False) as srv:
        async with client(srv.url).realtime.connect(model="omnivoice") as conn:
            rec = Recorder(conn)
            sid = (await rec.next("session.created")).session.id
            # the spoken turn is also transcribed: a prompt of its own, featurized with the response's
            transcribed = {"type": "realtime", "audio": {"input": {"transcription": {"model": "whisper-1"}}}}
            await conn.session.update(session=transcribed)  # type: ignore[arg-type]
            # two typed-in clips of 3 s (75 of the fake model's 200 tokens each), one response each
            for seed in range(2):
                await conn.conversation.item.create(item=audio_item(3.0, seed))  # type: ignore[arg-type]
                await conn.response.create()
                await rec.next("response.done")
            # a spoken turn (server VAD: an early prefill at its start, a response at its end), then
            # one more clip: the history no longer fits, the oldest items are left out
            await send_audio(conn, pcm16(0.5, speech, 1.0))
            await rec.next("response.done")
            await rec.first("conversation.item.input_audio_transcription.completed")
            await conn.conversation.item.create(item=audio_item(3.0, 2))  # type: ignore[arg-type]
            await conn.response.create()
            await rec.next("response.done")
            conversation = srv.app.state.realtime.sessions[sid].conversation
            clips = [c for item in conversation.items for c in item.content if c.audio is not None]
            await rec.close()
    engine = srv.engine
    assert len(clips) == 4 and all(c.features is not None and c.stream is None for c in clips)
    # every frame of every clip computed once, whatever the prompts built from them
    assert engine.log_mel.frames_computed == sum(c.audio.size // 160 for c in clips)
    prompts = [
        [p for m in messages for p in m.parts if isinstance(p, AudioPart)] for messages in engine.prompts
    ]
    assert all(p.features is not None for parts in prompts for p in parts)
    assert len(engine.warmed) == 1 and len(prompts) >= 6  # a transcription's among them
    assert len(prompts[-1]) < 4, "the last prompt left the oldest clips out"
    # the spoken turn's whole windows went ahead, as the finished clip has them (but for frames the
    # clip's louder end raised to its floor)
    spoken = clips[2].features
    floor = spoken.max() - 2  # (top - 8 + 4) / 4, where the top frame is (top + 4) / 4
    ahead = [w for key, windows in engine.ahead if key == sid for w in windows]
    assert len(ahead) >= spoken.shape[1] // WINDOW - 2
    for k, window in enumerate(ahead):
        final = spoken[:, k * WINDOW : (k + 1) * WINDOW]
        assert window.shape == (128, WINDOW)
        changed = window != final
        np.testing.assert_allclose(final[changed], floor, rtol=0, atol=1e-6)


async def test_a_confirmed_speculative_turn_keeps_the_features_its_response_was_prompted_with(
    tmp_path: Path,
) -> None:
    """Speculative responses on (the default): the response started at the pause was prompted with the
    turn's item, featurized from the frames computed while it was spoken; the turn commits that item,
    features and all, and nothing featurizes it again."""
    speech = speak("Tell me something about the weather at the sea.", tmp_path)
    with serve_realtime() as srv:
        async with client(srv.url).realtime.connect(model="omnivoice") as conn:
            rec = Recorder(conn)
            sid = (await rec.next("session.created")).session.id
            await send_audio(conn, pcm16(0.5, speech, 1.0))
            await rec.next("response.done")
            (item,) = srv.app.state.realtime.sessions[sid].conversation.items[:1]
            await rec.close()
    engine = srv.engine
    (clip,) = item.content
    last = [p for m in engine.prompts[-1] for p in m.parts if isinstance(p, AudioPart)]
    assert last[-1].features is clip.features is not None  # the response's prompt had these very ones
    np.testing.assert_allclose(clip.features, engine.log_mel(clip.audio), rtol=0, atol=1e-6)
