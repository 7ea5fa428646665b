"""Media tracks of one call: the model's voice out (`PlayoutTrack`), the microphone in (`read_microphone`).

The server owns playout here: audio deltas are queued on the outgoing track, which sends one 20 ms
frame per tick in real time (silence when nothing is queued), so a barge-in can `clear` what has not
been played yet. Progress goes back to the session: a delta's `on_played` runs once its last sample
has left (the item's ledger then counts played audio, which is what the user heard), and the
`output_audio_buffer.started|stopped|cleared` events are emitted here.
"""

from __future__ import annotations

import asyncio
import fractions
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame

from omnivoice.audio.resample import StreamResampler

log = logging.getLogger(__name__)

RATE = 48000  # Opus
FRAME = 960  # 20 ms at 48 kHz
TIME_BASE = fractions.Fraction(1, RATE)
MAX_LAG_S = 0.1  # further behind the clock (a stalled loop): skip ahead rather than burst


@dataclass
class _Piece:
    response_id: str
    item_id: str
    pcm: np.ndarray  # int16 at 48 kHz
    on_played: Callable[[], None] | None
    pos: int = 0


class PlayoutTrack(MediaStreamTrack):
    """The outgoing audio track: queued response audio, paced in 20 ms frames of 48 kHz mono s16."""

    kind = "audio"

    def __init__(self, emit: Callable[[dict[str, Any]], None]) -> None:
        super().__init__()
        self._emit = emit  # puts an output_audio_buffer.* event on the session's outbox
        self._queue: deque[_Piece] = deque()
        self._resampler: StreamResampler | None = None
        self._playing: tuple[str, str] | None = None  # (response id, item id) being played out
        self._ended: set[str] = set()  # responses with no more audio coming
        self._cleared: set[str] = set()  # responses cut off: late audio is dropped
        self._start = 0.0
        self._pts: int | None = None
        self.frames_sent = 0
        self.audio_frames_sent = 0

    @property
    def queued_ms(self) -> int:
        return sum(p.pcm.size - p.pos for p in self._queue) * 1000 // RATE

    def play(
        self, response_id: str, item_id: str, pcm: np.ndarray, rate: int, on_played: Callable[[], None] | None
    ) -> None:
        """Queue one audio delta (float32 mono at `rate`)."""
        if response_id in self._cleared:
            return
        if self._resampler is None or self._resampler.in_rate != rate:
            self._resampler = StreamResampler(rate, RATE)
        out = self._resampler.process(pcm)
        self._queue.append(_Piece(response_id, item_id, _s16(out), on_played))

    def finish(self, response_id: str) -> None:
        """`response.done`: no more audio will come for `response_id`."""
        if response_id in self._cleared:
            self._cleared.discard(response_id)  # nothing of it can come after its response.done
            return
        if self._resampler is not None:
            tail = self._resampler.flush()
            if tail.size and self._queue and self._queue[-1].response_id == response_id:
                last = self._queue[-1]
                self._queue.append(_Piece(response_id, last.item_id, _s16(tail), None))
        queued = any(p.response_id == response_id for p in self._queue)
        if queued or (self._playing is not None and self._playing[0] == response_id):
            self._ended.add(response_id)
            self._maybe_stopped()

    def clear(self, response_id: str | None) -> str | None:
        """Drop everything queued (barge-in, `output_audio_buffer.clear`) and any later audio of
        `response_id`. Returns the id of the item whose playout was cut short, if one was playing."""
        if response_id is not None:
            self._cleared.add(response_id)
        self._queue.clear()
        if self._resampler is not None:
            self._resampler.reset()
        playing, self._playing = self._playing, None
        self._ended.clear()
        if playing is None:
            return None
        self._emit({"type": "output_audio_buffer.cleared", "response_id": playing[0]})
        return playing[1]

    def stop(self) -> None:
        """End the track (the call is over): drop the queued audio and the outbox's `emit`, which
        would otherwise keep this track and the outbox (which holds it) in a reference cycle."""
        super().stop()
        self._queue.clear()
        self._emit = _ignore

    async def recv(self) -> AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        await self._tick()
        frame = AudioFrame(format="s16", layout="mono", samples=FRAME)
        frame.planes[0].update(self._next_samples().tobytes())
        frame.pts = self._pts
        frame.sample_rate = RATE
        frame.time_base = TIME_BASE
        self.frames_sent += 1
        return frame

    async def _tick(self) -> None:
        """Wait until the next frame is due (one every 20 ms of wall time)."""
        now = time.monotonic()
        if self._pts is None:
            self._start, self._pts = now, 0
            return
        self._pts += FRAME
        due = self._start + self._pts / RATE
        if now - due > MAX_LAG_S:
            self._start += now - due  # the loop stalled: restart the clock instead of bursting
        elif due > now:
            await asyncio.sleep(due - now)

    def _next_samples(self) -> np.ndarray:
        out = np.zeros(FRAME, np.int16)
        filled = 0
        while filled < FRAME and self._queue:
            piece = self._queue[0]
            if self._playing is None or self._playing[0] != piece.response_id:
                self._maybe_stopped()  # the previous response has played out
                self._playing = (piece.response_id, piece.item_id)
                self._emit({"type": "output_audio_buffer.started", "response_id": piece.response_id})
            n = min(FRAME - filled, piece.pcm.size - piece.pos)
            out[filled : filled + n] = piece.pcm[piece.pos : piece.pos + n]
            filled += n
            piece.pos += n
            if piece.pos == piece.pcm.size:
                self._queue.popleft()
                if piece.on_played is not None:
                    piece.on_played()
        if filled:
            self.audio_frames_sent += 1
        self._maybe_stopped()
        return out

    def _maybe_stopped(self) -> None:
        """`stopped` once the playing response has ended and none of its audio is queued (the queue
        is in order: the next response's audio may already wait behind it)."""
        if self._playing is None or self._playing[0] not in self._ended:
            return
        rid = self._playing[0]
        if not self._queue or self._queue[0].response_id != rid:
            self._emit({"type": "output_audio_buffer.stopped", "response_id": rid})
            self._ended.discard(rid)
            self._playing = None


def _ignore(event: dict[str, Any]) -> None:
    """`emit` of a stopped track."""


def _s16(pcm: np.ndarray) -> np.ndarray:
    return (np.clip(pcm, -1.0, 1.0) * 32767.0).astype(np.int16)


def frame_to_mono(frame: AudioFrame) -> np.ndarray:
    """A decoded audio frame (s16 or float, packed or planar, any channels) as mono float32."""
    data = frame.to_ndarray()  # packed: [1, samples * channels]; planar: [channels, samples]
    channels = len(frame.layout.channels)
    x = data.reshape(-1, channels) if frame.format.is_packed else data.T
    mono = x.astype(np.float32).mean(axis=1)
    if data.dtype.kind == "i":
        mono /= float(2 ** (8 * data.dtype.itemsize - 1))
    return mono


async def read_microphone(track: MediaStreamTrack, deliver: Callable[[np.ndarray, int], None]) -> None:
    """Decode the remote audio track until it ends, delivering each frame as mono float32 with its
    sample rate (the session resamples it off the event loop, with its VAD)."""
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        if not isinstance(frame, AudioFrame):
            raise TypeError(f"expected audio frames from the microphone track, got {type(frame).__name__}")
        pcm = frame_to_mono(frame)
        if pcm.size:
            deliver(pcm, frame.sample_rate)
