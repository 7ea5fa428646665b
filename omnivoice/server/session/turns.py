"""A session's input audio and its turns: what the client appends, server VAD over it, and the user
items it commits.

`input_audio_buffer.append` is decoded and resampled to 16 kHz (`decoder`), Twilio's G.711 likewise
by the call, and WebRTC's decoded audio resampled (`append`'s `convert`), by the app's front door
(audio/front_door.py), off the event loop. With server VAD on, `append` scores the audio (Silero,
batched with the other sessions' appends by the front door) and returns the turn detector's events
in order; the session acts on each (a barge-in, a response) and reports it here (`speech_started`,
`speech_stopped`), which sends the speech events and commits the spoken audio as a user item. At a
pause in the speech, `spoken` gives the turn so far as the item it would commit, without committing
it (a speculative response is prompted with it, and `speech_stopped` commits that same item if the
turn ends there). Without VAD the client commits
(`commit`) or clears (`clear`) the buffer itself. `Turns` knows nothing of responses: the session
decides what a turn does.

With `semantic_vad`, a pause is also put to the end-of-turn model (`done_at_pause`, the app's
`TurnJudge`, with the turn's audio so far); when it says the caller is done, the session ends the turn
there (`end_turn`) instead of waiting for the eagerness's ceiling of silence. The detector's events are
read one at a time (`append` returns them lazily), so the frames after a turn ended this way are read
as what follows the turn: a new turn if the caller goes on.

While a turn is spoken (server VAD), its log-mel features are computed as its audio arrives, by the
front door with the VAD (batched across sessions), so the committed item's features need only their
last frames; each whole audio-encoder window of them is put in `ahead` for the session to have
encoded ahead.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omnivoice.audio.front_door import FrontDoor, Scoring
from omnivoice.audio.log_mel import LogMel, LogMelStream
from omnivoice.audio.resample import Resampler, input_resampler
from omnivoice.audio.turn_features import WINDOW_SAMPLES
from omnivoice.audio.vad import VadStream
from omnivoice.audio.wav import AudioDecodeError
from omnivoice.server.session import protocol as p
from omnivoice.server.session.conversation import INPUT_RATE, Content, Conversation, Item, new_id
from omnivoice.server.session.end_of_turn import TurnJudge
from omnivoice.server.session.input_audio import BufferFull, InputBuffer, TurnDetector, TurnEvent
from omnivoice.server.session.outbox import Outbox
from omnivoice.server.session.session_config import SessionSettings

log = logging.getLogger(__name__)

MIN_COMMIT_MS = 100

# a run of appends received together: each one's audio (as it came) and event id
Run = list[tuple[Any, str | None]]
# appends handled as one run at most (~0.5 s of 20 ms appends): a session far behind catches up a
# run a tick, each tick of the front door stays short for the other sessions, and a turn that
# arrived all at once is still featurized (and encoded ahead) while the rest of it is read
RUN_APPENDS = 25
ConvertOne = Callable[[Any, str | None], np.ndarray]  # one append's audio (and id) -> 16 kHz float32


class Turns:
    """The input buffer (at most `max_samples` at 16 kHz), the VAD stream and turn detector, and the
    turn being spoken. Committed items go into `conversation`, events to `outbox`. `log_mel` (None:
    none) featurizes a turn while it is spoken; `window_frames` (0: none) is the audio encoder's
    window, whose whole windows of a turn's features go to `ahead`. `judge` (None: none) is the
    end-of-turn model of `semantic_vad`; without it a semantic_vad turn ends at its ceiling.
    `front_door` (the app's, shared by its sessions; None: one of this session's own, without worker
    threads) converts and scores the appended audio."""

    def __init__(
        self,
        settings: SessionSettings,
        vad: VadStream,
        max_samples: int,
        conversation: Conversation,
        outbox: Outbox,
        pause_ms: int = 0,
        log_mel: LogMel | None = None,
        window_frames: int = 0,
        judge: TurnJudge | None = None,
        front_door: FrontDoor | None = None,
    ) -> None:
        self.settings = settings
        self._front_door = front_door if front_door is not None else FrontDoor(workers=0)
        self._judge = judge
        self._pause_ms = pause_ms  # silence after speech that is a pause (TurnDetector)
        self.buffer = InputBuffer(max_samples)
        self._vad = vad
        self._conversation = conversation
        self._outbox = outbox
        td = settings.turn_detection
        self._detector = TurnDetector(td, pause_ms=pause_ms) if td else None
        self._speech: tuple[str, int] | None = None  # (item id, audio start) of the turn being spoken
        self._in: Resampler = input_resampler(settings.input_format.sample_rate, INPUT_RATE)
        self._log_mel = log_mel if log_mel is not None and log_mel.sample_rate == INPUT_RATE else None
        self._window = window_frames
        self._stream: LogMelStream | None = None  # the features of the turn being spoken, so far
        self._windows_out = 0  # whole windows of them put in `ahead`
        self.ahead: list[np.ndarray] = []  # whole windows [n_mels, window_frames] for the session to send

    @property
    def max_seconds(self) -> float:
        """How much audio the buffer (and so one committed item) may hold."""
        return self.buffer.max_samples / INPUT_RATE

    def configure(self, new: SessionSettings) -> None:
        """The session's settings changed: follow a new input format or turn detection."""
        old, self.settings = self.settings, new
        if new.input_format != old.input_format:
            self._in = input_resampler(new.input_format.sample_rate, INPUT_RATE)
        if new.turn_detection != old.turn_detection:
            position = self._detector.next_frame if self._detector else self.buffer.end
            if self._detector is None:
                self._vad.reset()
            td = new.turn_detection
            self._detector = TurnDetector(td, position, self._pause_ms) if td else None
            self._speech = self._stream = None
            if td is not None and td.semantic is not None and self._judge is not None:
                self._judge.prepare()

    # ---- appending ------------------------------------------------------------------------------
    def check_append(self, e: p.AudioAppend) -> None:
        """Refuse an append whose audio could never fit the input buffer, before decoding it."""
        fmt = self.settings.input_format
        seconds = self.max_seconds
        if len(e.audio) * 3 // 4 > int(fmt.sample_rate * fmt.bytes_per_sample * seconds):
            message = f"the audio is longer than the input buffer's limit of {seconds:g} s"
            raise p.ProtocolError(message, "input_audio_buffer_too_large", "audio", e.event_id)

    def decoder(self, event_id: str | None) -> Callable[[str], np.ndarray]:
        """What turns an append's base64 audio into float32 PCM at 16 kHz (for `append`'s `convert`)."""
        return lambda audio: self._decode(audio, event_id)

    def _decode(self, audio: str, event_id: str | None) -> np.ndarray:
        try:
            raw = base64.b64decode(audio, validate=True)
            pcm = self.settings.input_format.decode(raw)
        except (binascii.Error, ValueError) as err:
            message = str(err) if isinstance(err, AudioDecodeError) else "the audio is not valid base64"
            raise p.ProtocolError(message, "invalid_value", "audio", event_id) from None
        return self._in.process(pcm)

    async def append(
        self, audio: Any, event_id: str | None = None, convert: Callable[[Any], np.ndarray] | None = None
    ) -> Iterator[TurnEvent]:
        """Append mono float32 audio at 16 kHz (or `audio` as it came, which `convert` turns into
        that); with server VAD, the turn detector's events in order, each computed as it is read
        (`end_turn` after one changes those after it).

        Converting (base64, G.711, resampling), VAD and the spoken turn's log-mel run as one job of
        the front door, off the event loop, together with the other sessions' appends. The session
        handles its events one at a time, so the buffer and the streams are the job's while it runs."""
        if self._detector is None and convert is None:
            self._buffer(audio, event_id)
            return iter(())
        return await self._score(_Append(self, audio, convert, event_id))

    async def append_run(
        self, run: Run, convert: ConvertOne | None = None
    ) -> tuple[Iterator[TurnEvent], list[p.ProtocolError]]:
        """`append` for consecutive appends received together (each its audio and event id), as one
        front-door job: each is converted (`convert`: by default an `input_audio_buffer.append`'s
        base64) and buffered as `append` would, in order, so the buffer holds what fits and only what
        does not is refused; their audio is scored together. Returns the turn detector's events and
        the errors of the appends refused (not audio, or no room)."""
        job = _AppendRun(self, run, convert or self._decode)
        return await self._score(job), job.refused

    async def _score(self, job: _Append | _AppendRun) -> Iterator[TurnEvent]:
        if self._stream is not None and self._speech is not None and self._detector is not None:
            # the turn ends where the detector hears it end: never before the audio scored so far
            job.stream, job.safe = self._stream, self._detector.next_frame - self._speech[1]
        probs, windows = await self._front_door.score(job)
        self.ahead += windows
        if self._detector is None or not probs:
            return iter(())
        return self._events(self._detector, probs)

    def _events(self, detector: TurnDetector, probs: list[float]) -> Iterator[TurnEvent]:
        for event in detector.events(probs):
            if self._detector is not detector:
                return  # the turn detection changed while they were read (WebRTC): they are void
            yield event

    def _take(self, job: _Append) -> Scoring | None:
        """(front door) Convert and buffer the audio; with server VAD, what to score of it."""
        pcm = job.convert(job.audio) if job.convert is not None else job.audio
        self._buffer(pcm, job.event_id)
        if self._detector is None or not pcm.size:
            return None
        return Scoring(pcm, self._vad, job.stream, job.safe)

    def _take_run(self, job: _AppendRun) -> Scoring | None:
        """(front door) `_take` for a run: each append decoded, resampled and buffered in turn."""
        kept = []
        for i, (audio, event_id) in enumerate(job.audio):
            try:
                pcm = job.convert(audio, event_id)
                # trimmed (while idle) once, before the run, as one append of it would be: the speech
                # that starts in the run is scored only after all of it is buffered
                self._buffer(pcm, event_id, trim=i == 0)
            except p.ProtocolError as e:
                job.refused.append(e)
                continue
            kept.append(pcm)
        pcm = np.concatenate(kept) if kept else np.zeros(0, np.float32)
        if self._detector is None or not pcm.size:
            return None
        return Scoring(pcm, self._vad, job.stream, job.safe)

    def _windows(self, stream: LogMelStream | None) -> list[np.ndarray]:
        """(front door) The spoken turn's whole encoder windows completed since the last call."""
        windows: list[np.ndarray] = []
        if stream is None or not self._window:
            return windows
        while stream.frames >= (self._windows_out + 1) * self._window:
            start = self._windows_out * self._window
            windows.append(stream.features(start, start + self._window))
            self._windows_out += 1
        return windows

    def _buffer(self, pcm: np.ndarray, event_id: str | None, trim: bool = True) -> None:
        if trim and self._detector is not None and not self._detector.speaking:
            self.buffer.trim(self.buffer.end - self._keep_while_idle())
        try:
            self.buffer.append(pcm)
        except BufferFull:
            message = f"the input audio buffer is full ({self.max_seconds:g} s); commit or clear it"
            raise p.ProtocolError(message, "input_audio_buffer_full", "audio", event_id) from None

    def _keep_while_idle(self) -> int:
        td = self.settings.turn_detection
        return int((td.prefix_padding_ms if td else 0) * INPUT_RATE / 1000) + 4 * 512

    # ---- server VAD -----------------------------------------------------------------------------
    def speech_started(self, position: int) -> None:
        """The detector heard speech start at `position`: a turn begins, `prefix_padding_ms` before."""
        td = self.settings.turn_detection
        assert td is not None
        start = max(self.buffer.start, position - td.prefix_padding_ms * INPUT_RATE // 1000)
        self._speech = (new_id("item"), start)
        if self._log_mel is not None:
            self._stream, self._windows_out = self._log_mel.stream(), 0
            self._stream.extend(self.buffer.peek(start, self.buffer.end))
        self._outbox.put(
            {
                "type": "input_audio_buffer.speech_started",
                "audio_start_ms": start * 1000 // INPUT_RATE,
                "item_id": self._speech[0],
            }
        )

    async def done_at_pause(self) -> bool:
        """semantic_vad, at a pause just read from `append`'s events: whether the end-of-turn model
        says the caller is done, from the turn's audio (its last 8 s) up to where the pause was heard.
        False for server_vad, without a model, or when the model fails (the ceiling ends the turn)."""
        td, detector = self.settings.turn_detection, self._detector
        semantic = td.semantic if td is not None else None
        if semantic is None or self._judge is None or detector is None or self._speech is None:
            return False
        heard = detector.next_frame
        clip = self.buffer.peek(max(self._speech[1], heard - WINDOW_SAMPLES), heard)
        try:
            prob = await self._judge.score(clip)
        except Exception:
            log.warning("the end-of-turn model failed; the turn waits for its ceiling", exc_info=True)
            return False
        if self._detector is not detector or not detector.speaking:
            return False  # the settings changed while it was scored: that turn is gone
        done = prob >= semantic.done
        self._judge.count(done)
        return done

    def end_turn(self) -> int:
        """End the turn being spoken where the pause was heard (after `done_at_pause`); returns that
        position, for `speech_stopped`."""
        assert self._detector is not None
        return self._detector.end_turn()

    def spoken(self, position: int) -> Item | None:
        """The turn's audio up to `position` as the user item it would commit, without committing it
        (the buffer keeps the audio; nothing is sent); None when no turn is being spoken."""
        if self._speech is None:
            return None
        item_id, start = self._speech
        # its features: the frames computed so far that end before `position` (the stream goes on)
        stream = self._stream.fork(position - start) if self._stream is not None else None
        return _user_item(item_id, self.buffer.peek(start, position), stream)

    def speech_stopped(self, position: int, spoken: Item | None = None) -> Item | None:
        """The detector heard the speech end at `position`: the turn's audio becomes a user item
        (returned), or None when no turn was being spoken. `spoken` (from `spoken`, for this turn) is
        committed instead: the turn's audio up to an earlier position, its trailing silence left out."""
        if self._speech is None:
            return None
        item_id, start = self._speech
        stream, self._speech, self._stream = self._stream, None, None
        self._outbox.put(
            {
                "type": "input_audio_buffer.speech_stopped",
                "audio_end_ms": position * 1000 // INPUT_RATE,
                "item_id": item_id,
            }
        )
        audio = self.buffer.take(start, position)
        if spoken is None:
            return self._commit(_user_item(item_id, audio, stream))
        assert spoken.id == item_id, "the spoken item of another turn"
        return self._commit(spoken)

    # ---- the client's commit and clear ----------------------------------------------------------
    def commit(self, event_id: str | None) -> Item:
        """`input_audio_buffer.commit`: the whole buffer becomes a user item."""
        pcm = self._in.flush()
        if pcm.size:
            self.buffer.append(pcm[: max(0, self.buffer.max_samples - self.buffer.samples)])
        if self.buffer.samples * 1000 < MIN_COMMIT_MS * INPUT_RATE:
            ms = self.buffer.samples * 1000 / INPUT_RATE
            message = (
                f"Error committing input audio buffer: buffer too small. Expected at least "
                f"{MIN_COMMIT_MS}ms of audio, but buffer only has {ms:.2f}ms of audio."
            )
            raise p.ProtocolError(message, "input_audio_buffer_commit_empty", None, event_id)
        item_id = self._speech[0] if self._speech else new_id("item")
        self._speech = self._stream = None  # the whole buffer: not the audio the stream featurized
        audio = self.buffer.take(self.buffer.start, self.buffer.end)
        if self._detector is not None:
            self._detector.reset(self._detector.next_frame)
        return self._commit(_user_item(item_id, audio))

    def _commit(self, item: Item) -> Item:
        item_id = item.id
        prev = self._conversation.insert(item)
        self._outbox.put(
            {"type": "input_audio_buffer.committed", "previous_item_id": prev, "item_id": item_id}
        )
        self._outbox.put({"type": "conversation.item.added", "previous_item_id": prev, "item": item.wire()})
        self._outbox.put({"type": "conversation.item.done", "previous_item_id": prev, "item": item.wire()})
        return item

    def clear(self) -> None:
        """`input_audio_buffer.clear`: drop the buffer and the turn being spoken."""
        self.buffer.clear()
        self._speech = self._stream = None
        self._in.reset()
        self._vad.reset()
        if self._detector is not None:
            self._detector.reset(self.buffer.end)
        self._outbox.put({"type": "input_audio_buffer.cleared"})


@dataclass
class _Append:
    """One append as a front-door job (`Turns.append`): `stream` is the spoken turn's, to be advanced
    to `safe` samples into it."""

    turns: Turns
    audio: Any
    convert: Callable[[Any], np.ndarray] | None
    event_id: str | None
    stream: LogMelStream | None = None
    safe: int = 0

    def take(self) -> Scoring | None:
        return self.turns._take(self)

    def finish(self, probs: list[float]) -> tuple[list[float], list[np.ndarray]]:
        return probs, self.turns._windows(self.stream)


@dataclass
class _AppendRun:
    """Consecutive appends as one front-door job (`Turns.append_run`): their audio and event ids, in
    order; `refused` collects the errors of those that were not audio or did not fit."""

    turns: Turns
    audio: Run
    convert: ConvertOne
    stream: LogMelStream | None = None
    safe: int = 0
    refused: list[p.ProtocolError] = field(default_factory=list)

    def take(self) -> Scoring | None:
        return self.turns._take_run(self)

    def finish(self, probs: list[float]) -> tuple[list[float], list[np.ndarray]]:
        return probs, self.turns._windows(self.stream)


def _user_item(item_id: str, audio: np.ndarray, stream: LogMelStream | None = None) -> Item:
    return Item(item_id, "user", [Content("input_audio", audio=audio, stream=stream)])
