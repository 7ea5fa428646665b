"""Sessions' turns scored by one shared front door, its worker threads batching their appends, come out
as each session scored alone: the same speech events at the same positions, the same committed audio
and features, the same encoder windows sent ahead; a bad append fails its own session's event only."""

from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass, field

import numpy as np
import pytest
from transformers import WhisperFeatureExtractor

from omnivoice.audio.front_door import FrontDoor
from omnivoice.audio.log_mel import LogMel
from omnivoice.audio.vad import SileroVad
from omnivoice.server.session import protocol as p
from omnivoice.server.session.conversation import Conversation
from omnivoice.server.session.input_audio import SpeechPaused, SpeechResumed, SpeechStarted, SpeechStopped
from omnivoice.server.session.outbox import Outbox
from omnivoice.server.session.session_config import SessionSettings
from omnivoice.server.session.turns import Turns
from tests.support.speech import pcm16, speak

CHUNK = 960  # bytes of 24 kHz pcm16 per append: 20 ms, as the realtime bench sends
WINDOW = 100  # encoder window (frames) here: a spoken turn has several
BAD = 20  # the append of session 1 that is not base64


@dataclass
class Heard:
    events: list[tuple[str, int]] = field(default_factory=list)
    items: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)  # committed (audio, features)
    ahead: list[np.ndarray] = field(default_factory=list)
    errors: list[tuple[int, str]] = field(default_factory=list)  # (append, code)


async def no_send(_: str) -> None:
    pass


def appends(session: int, speech: np.ndarray) -> list[str]:
    """Session `session`'s audio in 20 ms base64 appends: two turns, after a silence of its own."""
    audio = pcm16(0.2 + 0.15 * session, speech, 1.0, speech[: speech.size // (session + 1)], 1.0)
    chunks = [base64.b64encode(audio[i : i + CHUNK]).decode() for i in range(0, len(audio), CHUNK)]
    if session == 1:
        chunks[BAD] = "not base64!"
    return chunks


async def talk(
    door: FrontDoor, vad: SileroVad, log_mel: LogMel, chunks: list[str], start: asyncio.Event
) -> Heard:
    """One session's turns, as `Session.append_audio` acts on them (without responses)."""
    await start.wait()
    heard = Heard()
    turns = Turns(
        SessionSettings(voice="ethan"), vad.stream(), 60 * 16000, Conversation(),
        Outbox(no_send, "sess", beta=False), pause_ms=96, log_mel=log_mel, window_frames=WINDOW,
        front_door=door,
    )  # fmt: skip
    for n, chunk in enumerate(chunks):
        try:
            events = await turns.append(chunk, f"ev{n}", turns.decoder(f"ev{n}"))
        except p.ProtocolError as e:
            heard.errors.append((n, e.code))
            continue
        for ev in events:
            heard.events.append((type(ev).__name__, ev.position))
            if isinstance(ev, SpeechStarted):
                turns.speech_started(ev.position)
            elif isinstance(ev, SpeechStopped):
                item = turns.speech_stopped(ev.position)
                assert item is not None
                content = item.content[0]
                assert content.audio is not None and content.stream is not None
                heard.items.append((content.audio, content.stream.finish(content.audio)))
            else:
                assert isinstance(ev, SpeechPaused | SpeechResumed)
        heard.ahead += turns.ahead
        turns.ahead = []
    return heard


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    return speak(
        "Hello, could you tell me when the next train to the city leaves?", tmp_path_factory.mktemp("t")
    )


async def test_sessions_sharing_a_front_door_hear_what_each_alone_hears(speech: np.ndarray) -> None:
    vad = SileroVad()
    extractor = WhisperFeatureExtractor(
        feature_size=128, sampling_rate=16000, hop_length=160, chunk_length=300, n_fft=400
    )
    log_mel = LogMel.of(extractor)
    sessions = [appends(i, speech) for i in range(4)]
    alone = FrontDoor(workers=0)
    opened = asyncio.Event()
    opened.set()
    want = [await talk(alone, vad, log_mel, chunks, opened) for chunks in sessions]

    door = FrontDoor(workers=2)
    late = asyncio.Event()  # sessions 2 and 3 open once the others are under way
    try:
        tasks = [
            asyncio.create_task(talk(door, vad, log_mel, c, opened if i < 2 else late))
            for i, c in enumerate(sessions)
        ]
        while door.jobs < 30:
            await asyncio.sleep(0.005)
        late.set()
        got = await asyncio.gather(*tasks)
    finally:
        await door.close()
    assert door.ticks < door.jobs, "some appends were scored together"

    assert want[1].errors == got[1].errors == [(BAD, "invalid_value")]
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        starts = [e for e in w.events if e[0] == "SpeechStarted"]
        assert len(starts) == 2 and len(w.items) == 2, f"session {i}: both turns heard"
        assert g.events == w.events
        assert i == 1 or not g.errors
        assert len(g.items) == len(w.items)
        for (ga, gf), (wa, wf) in zip(g.items, w.items, strict=True):
            np.testing.assert_array_equal(ga, wa)
            np.testing.assert_allclose(gf, wf, rtol=0, atol=1e-6)
            np.testing.assert_allclose(gf, log_mel(ga), rtol=0, atol=1e-6)
        assert len(g.ahead) == len(w.ahead) >= 2
        for ga, wa in zip(g.ahead, w.ahead, strict=True):
            np.testing.assert_allclose(ga, wa, rtol=0, atol=1e-6)
