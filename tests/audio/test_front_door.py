"""The front door scores many sessions' audio together as scoring each one alone would: the Silero VAD
batched across streams, log-mel frames of many streams in one FFT, with streams joining and leaving
between ticks and a bad job failing alone."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref

import numpy as np
import pytest
import soxr
from transformers import WhisperFeatureExtractor

from omnivoice.audio.front_door import FrontDoor, Scoring, run_alone
from omnivoice.audio.log_mel import LogMel, LogMelStream, advance_streams
from omnivoice.audio.vad import FRAME, SileroVad, VadStream, score_streams
from tests.support.speech import speak

RATE = 16000


@pytest.fixture(scope="module")
def vad() -> SileroVad:
    return SileroVad()


@pytest.fixture(scope="module")
def log_mel() -> LogMel:
    extractor = WhisperFeatureExtractor(
        feature_size=128, sampling_rate=RATE, hop_length=160, chunk_length=300, n_fft=400
    )
    return LogMel.of(extractor)


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    pcm = speak("Good morning, I would like to book a table for two.", tmp_path_factory.mktemp("door"))
    return soxr.resample(pcm, 24000, RATE).astype(np.float32)


def clips(speech: np.ndarray, n: int) -> list[np.ndarray]:
    """`n` sessions' audio: silence of different lengths around the speech, so their frames differ."""
    return [
        np.concatenate([np.zeros(700 * i + 37 * i * i, np.float32), speech, np.zeros(6000, np.float32)])
        for i in range(n)
    ]


CHUNKS = [320, 160, 1000, 512, 4096, 333]  # samples per append: 0 to 8 new VAD frames a tick
JOINS = [0, 0, 3, 7, 0, 12]  # the tick each session's first append comes in


def schedule(audio: list[np.ndarray]) -> list[list[tuple[int, np.ndarray]]]:
    """Ticks of (session, its next chunk): sessions join at JOINS and leave when their audio ends."""
    ticks: list[list[tuple[int, np.ndarray]]] = []
    at = [0] * len(audio)
    t = 0
    while any(at[i] < a.size for i, a in enumerate(audio)):
        tick = []
        for i, a in enumerate(audio):
            if t >= JOINS[i] and at[i] < a.size:
                tick.append((i, a[at[i] : at[i] + CHUNKS[i]]))
                at[i] += CHUNKS[i]
        ticks.append(tick)
        t += 1
    return ticks


def test_batched_vad_equals_each_stream_alone(vad: SileroVad, speech: np.ndarray) -> None:
    audio = clips(speech, len(CHUNKS))
    alone = [vad.stream() for _ in audio]
    batched = [vad.stream() for _ in audio]
    got: list[list[float]] = [[] for _ in audio]
    want: list[list[float]] = [[] for _ in audio]
    sizes = set()
    for tick in schedule(audio):
        probs = score_streams(vad, [(batched[i], chunk) for i, chunk in tick])
        for (i, chunk), p in zip(tick, probs, strict=True):
            got[i] += p
            want[i] += alone[i].process(chunk)
        sizes.add(sum(1 for i, chunk in tick if chunk.size >= FRAME))
    assert max(sizes) >= 3, "several streams were scored together"
    for i, a in enumerate(audio):
        assert len(got[i]) == len(want[i]) == a.size // FRAME
        np.testing.assert_allclose(got[i], want[i], rtol=0, atol=1e-5)
        assert max(got[i]) > 0.8 and min(got[i]) < 0.2  # speech and silence both heard


def test_a_batch_of_one_and_an_empty_batch(vad: SileroVad, speech: np.ndarray) -> None:
    assert score_streams(vad, []) == []
    stream, alone = vad.stream(), vad.stream()
    assert score_streams(vad, [(stream, speech[:100])]) == [[]]  # no frame completed yet
    np.testing.assert_allclose(
        score_streams(vad, [(stream, speech[100:5000])])[0], alone.process(speech[:5000]), atol=1e-5
    )


def test_batched_log_mel_equals_each_stream_alone(log_mel: LogMel, speech: np.ndarray) -> None:
    audio = clips(speech, len(CHUNKS))
    alone = [log_mel.stream() for _ in audio]
    batched = [log_mel.stream() for _ in audio]
    received = [0] * len(audio)
    for tick in schedule(audio):
        work: list[tuple[LogMelStream, int]] = []
        for i, chunk in tick:
            safe = received[i] - 7 * i  # the detector lags the audio a little, differently for each
            received[i] += chunk.size
            batched[i].extend(chunk)
            alone[i].extend(chunk)
            alone[i].advance(safe)
            work.append((batched[i], safe))
        advance_streams(work)
        for i, _ in tick:
            assert batched[i].frames == alone[i].frames
    log_mel.frames_computed = 0
    for i, a in enumerate(audio):
        got, want = batched[i].finish(a), alone[i].finish(a)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
        np.testing.assert_allclose(got, log_mel(a), rtol=0, atol=1e-6)  # the whole clip's features
        ahead = batched[i].features(0, batched[i].frames)  # the frames computed ahead, as they were
        np.testing.assert_allclose(ahead, alone[i].features(0, alone[i].frames), rtol=0, atol=1e-6)


class Append:
    """A session's append as a front-door job: `convert` of its audio, scored on `vad` (and `stream`)."""

    def __init__(self, audio: np.ndarray, vad: VadStream, stream: LogMelStream | None, safe: int) -> None:
        self.audio, self.vad, self.stream, self.safe = audio, vad, stream, safe
        self.gate: threading.Event | None = None  # the worker waits for it in `take`

    def take(self) -> Scoring | None:
        if self.gate is not None:
            self.gate.wait(30)
        if not np.isfinite(self.audio).all():
            raise ValueError("a bad payload")
        return Scoring(self.audio, self.vad, self.stream, self.safe) if self.audio.size else None

    def finish(self, probs: list[float]) -> tuple[list[float], int]:
        return probs, self.stream.frames if self.stream is not None else 0


async def test_the_front_door_scores_a_tick_together_and_fails_a_bad_job_alone(
    vad: SileroVad, log_mel: LogMel, speech: np.ndarray
) -> None:
    """Jobs queued while a worker is busy go into its next tick, all at once; the one that raises fails
    alone, and each result is what the job run by itself gives."""
    door = FrontDoor(workers=1)
    chunks = [speech[i * 2000 : (i + 1) * 2000 + 300 * i] for i in range(6)]
    bad = np.full(640, np.nan, np.float32)
    try:
        blocker = Append(speech[:640], vad.stream(), None, 0)
        blocker.gate = threading.Event()
        first = asyncio.ensure_future(door.score(blocker))
        while door.ticks == 0:  # the worker has taken it, and waits in its `take`
            await asyncio.sleep(0.01)
        streams = [(vad.stream(), log_mel.stream()) for _ in chunks]
        jobs = [Append(c, v, s, c.size - 200) for c, (v, s) in zip(chunks, streams, strict=True)]
        tasks = [asyncio.ensure_future(door.score(j)) for j in jobs[:3]]
        tasks.append(asyncio.ensure_future(door.score(Append(bad, vad.stream(), log_mel.stream(), 0))))
        tasks += [asyncio.ensure_future(door.score(j)) for j in jobs[3:]]
        await asyncio.sleep(0.05)
        blocker.gate.set()
        await first
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert door.ticks == 2 and door.jobs == 8  # the seven queued ones in one tick
    finally:
        await door.close()
    assert isinstance(results[3], ValueError)
    good = results[:3] + results[4:]
    for chunk, result in zip(chunks, good, strict=True):
        assert not isinstance(result, BaseException)
        want = run_alone(Append(chunk, vad.stream(), log_mel.stream(), chunk.size - 200))
        assert result[1] == want[1] > 0  # the log-mel frames computed
        np.testing.assert_allclose(result[0], want[0], rtol=0, atol=1e-5)


async def test_closing_fails_what_is_queued_and_refuses_more(vad: SileroVad, speech: np.ndarray) -> None:
    door = FrontDoor(workers=1)
    running = Append(speech[:1024], vad.stream(), None, 0)
    running.gate = threading.Event()
    first = asyncio.ensure_future(door.score(running))
    while door.ticks == 0:
        await asyncio.sleep(0.01)
    queued = asyncio.ensure_future(door.score(Append(speech[:1024], vad.stream(), None, 0)))
    await asyncio.sleep(0.01)
    closing = asyncio.ensure_future(door.close())
    await asyncio.sleep(0.01)
    running.gate.set()
    await closing
    probs, _ = await first  # the tick under way finishes
    assert len(probs) == 2
    with pytest.raises(RuntimeError, match="closed"):
        await queued
    with pytest.raises(RuntimeError, match="closed"):
        await door.score(Append(speech[:1024], vad.stream(), None, 0))


async def test_without_workers_each_job_runs_alone(vad: SileroVad, speech: np.ndarray) -> None:
    door = FrontDoor(workers=0)
    probs, _ = await door.score(Append(speech[:5000], vad.stream(), None, 0))
    np.testing.assert_allclose(probs, vad.stream().process(speech[:5000]), atol=1e-6)
    assert await door.score(Append(np.zeros(0, np.float32), vad.stream(), None, 0)) == ([], 0)
    with pytest.raises(ValueError, match="bad payload"):
        await door.score(Append(np.full(10, np.nan, np.float32), vad.stream(), None, 0))
    assert door.ticks == 0
    await door.close()


async def test_appends_that_come_together_wait_for_each_other(vad: SileroVad, speech: np.ndarray) -> None:
    """With `gather_s`, an idle front door waits that long from the first job for others to join it."""
    door = FrontDoor(workers=2, gather_s=1.0)
    try:
        results = await asyncio.gather(
            *(door.score(Append(speech[i * 1024 : (i + 1) * 1024], vad.stream(), None, 0)) for i in range(5))
        )
    finally:
        await door.close()
    assert (door.ticks, door.jobs) == (1, 5)
    assert [len(probs) for probs, _ in results] == [2] * 5


async def test_an_idle_front_door_holds_no_job(vad: SileroVad, speech: np.ndarray) -> None:
    """A finished job (and the session behind it) is freed at once, without the cyclic collector."""
    door = FrontDoor(workers=2)
    gc.disable()
    try:
        job = Append(speech[:1024], vad.stream(), None, 0)
        ref = weakref.ref(job)
        await door.score(job)
        del job
        for _ in range(100):  # the worker drops its tick's jobs once it has handed the results over
            if ref() is None:
                break
            await asyncio.sleep(0.01)
        assert ref() is None
    finally:
        gc.enable()
        await door.close()
