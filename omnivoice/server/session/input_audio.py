"""The input audio buffer and server-side turn detection over Silero VAD probabilities.

Positions are absolute sample indices at 16 kHz since the session's first appended audio, so the
`audio_start_ms` / `audio_end_ms` of speech events count from the start of the session's audio.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from omnivoice.audio.vad import FRAME
from omnivoice.server.session.session_config import TurnDetection

RATE = 16000
MIN_SPEECH_FRAMES = 2  # consecutive speech frames (64 ms) before speech starts: a click is not a turn
NEG_THRESHOLD_GAP = 0.15  # silence is prob < threshold - gap (hysteresis, as silero's own code)


class BufferFull(Exception):
    pass


class InputBuffer:
    """Audio appended since the last commit/clear, bounded at `max_samples`."""

    def __init__(self, max_samples: int) -> None:
        self.max_samples = max_samples
        self.start = 0  # absolute position of the first held sample
        self.end = 0  # absolute position after the last appended sample
        self._chunks: list[np.ndarray] = []

    @property
    def samples(self) -> int:
        return self.end - self.start

    def append(self, pcm: np.ndarray) -> None:
        if self.samples + pcm.size > self.max_samples:
            raise BufferFull
        if pcm.size:
            self._chunks.append(pcm)
            self.end += pcm.size

    def _all(self) -> np.ndarray:
        if len(self._chunks) > 1:
            self._chunks = [np.concatenate(self._chunks)]
        return self._chunks[0] if self._chunks else np.zeros(0, np.float32)

    def peek(self, start: int, end: int) -> np.ndarray:
        """A copy of the audio in [start, end), clipped to what is held; the buffer keeps it."""
        start, end = max(start, self.start), min(end, self.end)
        if end <= start:
            return np.zeros(0, np.float32)
        return self._all()[start - self.start : end - self.start].copy()

    def take(self, start: int, end: int) -> np.ndarray:
        """Audio in [start, end) (clipped to what is held); everything before `end` is dropped."""
        out = self.peek(start, end)
        self.trim(end)
        return out

    def trim(self, keep_from: int) -> None:
        """Drop audio before `keep_from`."""
        cut = min(max(keep_from, self.start), self.end) - self.start
        if cut > 0:
            self._chunks = [self._all()[cut:]]
            self.start += cut

    def clear(self) -> None:
        self._chunks = []
        self.start = self.end


@dataclass(frozen=True)
class SpeechStarted:
    position: int  # first sample of the speech (before prefix padding)


@dataclass(frozen=True)
class SpeechPaused:
    position: int  # end of the first silent frame after speech: the turn may end here


@dataclass(frozen=True)
class SpeechResumed:
    position: int  # first sample of the speech frame that ended the pause


@dataclass(frozen=True)
class SpeechStopped:
    position: int  # end of the silence that ended the turn


TurnEvent = SpeechStarted | SpeechPaused | SpeechResumed | SpeechStopped


class TurnDetector:
    """server_vad: speech starts after MIN_SPEECH_FRAMES frames at or above `threshold` and stops after
    `silence_duration_ms` of frames below `threshold - 0.15`; frames in between keep the state.

    While speaking, silence lasting `pause_ms` is a pause (`SpeechPaused`, placed at the end of its first
    silent frame): the turn ends there unless a speech frame comes first (`SpeechResumed`) before the
    silence has lasted `silence_duration_ms`. A pause long enough ends the turn (`SpeechStopped`, after
    its `SpeechPaused`). A `pause_ms` of a few frames keeps the gaps between words from counting as
    pauses (each one starts and drops a speculative response)."""

    def __init__(self, td: TurnDetection, position: int = 0, pause_ms: int = 0) -> None:
        self.td = td
        self.speaking = False
        self.next_frame = position  # absolute position of the next frame to score
        self._run = 0  # consecutive speech frames while idle
        self._silence = 0  # consecutive silent frames while speaking
        self._silence_frames = max(1, -(-td.silence_duration_ms * RATE // 1000 // FRAME))
        pause_frames = max(1, -(-pause_ms * RATE // 1000 // FRAME))
        self._pause_frames = min(pause_frames, self._silence_frames)
        self._pause_at = 0  # end of the first silent frame of the silence under way

    def update(self, probs: list[float]) -> list[TurnEvent]:
        """The events of `probs`, one speech probability per frame, in order."""
        return list(self.events(probs))

    def events(self, probs: list[float]) -> Iterator[TurnEvent]:
        """`update`, frame by frame as the events are read: after an event, `next_frame` is where it
        was heard, and `end_turn` there changes what the frames after it mean."""
        low = max(0.01, self.td.threshold - NEG_THRESHOLD_GAP)
        for p in probs:
            frame_start = self.next_frame
            self.next_frame += FRAME
            if not self.speaking:
                self._run = self._run + 1 if p >= self.td.threshold else 0
                if self._run >= MIN_SPEECH_FRAMES:
                    self.speaking, self._silence = True, 0
                    yield SpeechStarted(frame_start - (MIN_SPEECH_FRAMES - 1) * FRAME)
            elif p >= self.td.threshold:
                if self._silence >= self._pause_frames:
                    yield SpeechResumed(frame_start)
                self._silence = 0
            elif p < low:
                self._silence += 1
                if self._silence == 1:
                    self._pause_at = self.next_frame
                if self._silence == self._pause_frames:
                    yield SpeechPaused(self._pause_at)
                if self.speaking and self._silence >= self._silence_frames:
                    self.speaking, self._run = False, 0
                    yield SpeechStopped(self.next_frame)

    def end_turn(self) -> int:
        """End the turn being spoken where the detector is (`next_frame`, returned): the end-of-turn
        model heard it end at a pause. Speech after it starts a new turn."""
        self.speaking, self._run, self._silence = False, 0, 0
        return self.next_frame

    def reset(self, position: int) -> None:
        self.speaking, self._run, self._silence = False, 0, 0
        self.next_frame = position
