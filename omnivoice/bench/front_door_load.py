"""The load of `omnivoice bench front-door`: N callers' appends through one `FrontDoor`, as a server's
sessions make them, without network or engine.

Each caller sends 24 kHz pcm16 as base64 in 20 ms appends at real-time pace (a spoken question, then
silence, over and over, each caller starting at its own point of it) and, as a session's `Turns` does,
has each append decoded, resampled to 16 kHz, buffered and scored (Silero VAD; while a turn is spoken,
its log-mel features and whole encoder windows) by the front door, then reads the turn events off the
VAD's probabilities (server_vad's thresholds). The figures: the lag of each append's result behind the
time its audio was complete, and the turns heard against those the per-session path hears in the same
audio scored alone (`expected_turns`).
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from omnivoice.audio.front_door import FrontDoor, Scoring
from omnivoice.audio.log_mel import LogMel, LogMelStream
from omnivoice.audio.resample import StreamResampler
from omnivoice.audio.vad import FRAME, SileroVad, VadStream
from omnivoice.audio.wav import decode_pcm16

WIRE_RATE = 24000  # pcm16 of the realtime API
RATE = 16000
CHUNK_S = 0.02
CHUNK_BYTES = int(WIRE_RATE * CHUNK_S) * 2
THRESHOLD, LOW = 0.5, 0.35  # server_vad's threshold, and its silence below threshold - 0.15
START_FRAMES = 2  # speech frames in a row that start a turn
PREFIX_SAMPLES = RATE * 300 // 1000  # prefix_padding_ms
WINDOW_FRAMES = 100  # encoder window whose whole windows of a spoken turn are made ahead


class Detector:
    """server_vad's turns over VAD probabilities: speech starts after START_FRAMES frames at or above
    THRESHOLD and stops after `silence_frames` below LOW."""

    def __init__(self, silence_frames: int) -> None:
        self.silence_frames = silence_frames
        self.speaking = False
        self.next_frame = 0  # position (16 kHz samples) of the next frame
        self.starts: list[int] = []
        self.stops: list[int] = []
        self._run = self._silence = 0

    def update(self, probs: list[float]) -> tuple[bool, bool]:
        """Read `probs`; whether a turn (started, stopped) among them."""
        started = stopped = False
        for p in probs:
            self.next_frame += FRAME
            if not self.speaking:
                self._run = self._run + 1 if p >= THRESHOLD else 0
                if self._run >= START_FRAMES:
                    self.speaking, self._silence, started = True, 0, True
                    self.starts.append(self.next_frame - START_FRAMES * FRAME)
            elif p >= THRESHOLD:
                self._silence = 0
            elif p < LOW:
                self._silence += 1
                if self._silence >= self.silence_frames:
                    self.speaking, self._run, stopped = False, 0, True
                    self.stops.append(self.next_frame)
        return started, stopped


@dataclass
class Caller:
    """One session's state: its resampler, VAD and detector, the audio since its turn began, and the
    spoken turn's log-mel stream."""

    vad: VadStream
    log_mel: LogMel
    detector: Detector
    resampler: StreamResampler = field(default_factory=lambda: StreamResampler(WIRE_RATE, RATE))
    audio: list[np.ndarray] = field(default_factory=list)  # 16 kHz, from `base` on
    base: int = 0
    received: int = 0
    stream: LogMelStream | None = None
    turn_start: int = 0
    windows_out: int = 0
    windows: int = 0  # whole encoder windows made ahead

    def job(self, b64: str) -> Append:
        safe = self.detector.next_frame - self.turn_start if self.stream is not None else 0
        return Append(self, b64, self.stream, safe)

    def heard(self, probs: list[float]) -> None:
        """(event loop) Act on the turn events of `probs`: a turn's log-mel stream starts and ends."""
        started, stopped = self.detector.update(probs)
        if stopped:
            self.stream = None
        if started and self.detector.speaking:
            self.turn_start = max(self.base, self.detector.starts[-1] - PREFIX_SAMPLES)
            whole = np.concatenate(self.audio) if self.audio else np.zeros(0, np.float32)
            self.stream, self.windows_out = self.log_mel.stream(), 0
            self.stream.extend(whole[self.turn_start - self.base :])

    def trim(self) -> None:
        """(front door) While no turn is spoken, keep only what a turn starting now reaches back to."""
        keep = self.received - PREFIX_SAMPLES - 4 * FRAME
        if not self.detector.speaking and keep > self.base and self.audio:
            self.audio = [np.concatenate(self.audio)[keep - self.base :]]
            self.base = keep


@dataclass
class Append:
    """One append as a front-door job."""

    caller: Caller
    b64: str
    stream: LogMelStream | None
    safe: int

    def take(self) -> Scoring | None:
        c = self.caller
        pcm = c.resampler.process(decode_pcm16(base64.b64decode(self.b64, validate=True)))
        c.trim()
        c.audio.append(pcm)
        c.received += pcm.size
        return Scoring(pcm, c.vad, self.stream, self.safe) if pcm.size else None

    def finish(self, probs: list[float]) -> list[float]:
        c, stream = self.caller, self.stream
        while stream is not None and stream.frames >= (c.windows_out + 1) * WINDOW_FRAMES:
            start = c.windows_out * WINDOW_FRAMES
            stream.features(start, start + WINDOW_FRAMES)
            c.windows_out += 1
            c.windows += 1
        return probs


@dataclass
class CallerResult:
    lags_s: list[float]
    starts: list[int]
    stops: list[int]
    windows: int


def wire_chunks(pcm24: np.ndarray) -> list[str]:
    """24 kHz float audio as base64 pcm16 appends of 20 ms."""
    data = (np.clip(pcm24, -1, 1) * 32767).astype("<i2").tobytes()
    return [base64.b64encode(data[i : i + CHUNK_BYTES]).decode() for i in range(0, len(data), CHUNK_BYTES)]


async def call(
    door: FrontDoor,
    caller: Caller,
    chunks: list[str],
    t0: float,
    progress: Callable[[], None] | None = None,
) -> CallerResult:
    """Send `chunks` at real-time pace from `t0` (perf_counter), each once the last was answered."""
    lags: list[float] = []
    for k, chunk in enumerate(chunks):
        due = t0 + (k + 1) * CHUNK_S  # the chunk's audio is complete then
        wait = due - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        probs = await door.score(caller.job(chunk))
        lags.append(time.perf_counter() - due)
        caller.heard(probs)
        if progress is not None:
            progress()
    d = caller.detector
    return CallerResult(lags, d.starts, d.stops, caller.windows)


def expected_turns(vad: SileroVad, chunks: list[str], silence_frames: int) -> tuple[int, int]:
    """The turns (starts, stops) the per-session path hears in `chunks`, scored alone and at once."""
    resampler, stream = StreamResampler(WIRE_RATE, RATE), vad.stream()
    pcm = np.concatenate([resampler.process(decode_pcm16(base64.b64decode(c))) for c in chunks])
    detector = Detector(silence_frames)
    detector.update(stream.process(pcm))
    return len(detector.starts), len(detector.stops)
