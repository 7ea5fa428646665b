"""The session's outbox on a Twilio call: `media`, `mark` and `clear` out, nothing else.

The session and its responses put realtime events here, as on `/v1/realtime`. Audio deltas (u-law,
8 kHz) are cut into 20 ms frames and sent on a real-time clock, at most `ahead_s` ahead of playback at
the carrier, each delta closed by a `mark`; the delta's `on_sent` (its ledger's count) runs when the
carrier echoes that mark, i.e. once played (`Playout`). Every other event goes to `on_event` (the
call). A barge-in (`interrupt`) drops the audio not sent yet and sends `clear` before anything else.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from starlette.websockets import WebSocket

from omnivoice.server.session.outbox import Event, Outbox, OutboxLimits, Queued
from omnivoice.server.telephony.playout import Playout
from omnivoice.server.telephony.twilio_protocol import (
    FRAME_BYTES,
    RATE,
    clear_message,
    mark_message,
    media_message,
)

FRAME_S = FRAME_BYTES / RATE
ULAW_SILENCE = b"\xff"  # pads an item's last partial frame
_DELTA = "response.output_audio.delta"
_AUDIO = (_DELTA, "response.output_audio.done")


def _ignore(event: Event) -> None:
    """`on_event` once the call is over."""


@dataclass
class _Frame:
    item_id: str
    payload: bytes  # empty: a mark alone
    mark: bool = False
    on_played: list[Callable[[], None]] = field(default_factory=list)  # run when the mark is echoed


class TwilioOutbox(Outbox):
    def __init__(
        self,
        websocket: WebSocket,
        call_id: str,
        on_event: Callable[[Event], None],
        *,
        ahead_s: float,
        limits: OutboxLimits | None = None,
    ) -> None:
        super().__init__(websocket.send_text, call_id, beta=False, limits=limits)
        self.stream_sid = ""  # set at `start`; no audio flows before it
        self.playout = Playout()
        self.frames_sent = 0
        self._on_event = on_event
        self._ahead_s = ahead_s
        self._control: deque[str] = deque()  # wire messages that overtake the audio (clear)
        self._frames: deque[_Frame] = deque()
        self._item: str | None = None  # the item being framed
        self._leftover = b""  # less than a frame, waiting for the item's next delta
        self._unmarked: list[Callable[[], None]] = []  # callbacks of deltas whose mark is still to come
        self._cleared: str | None = None  # the item cut by the last barge-in: its late audio is dropped
        self._clock_start: float | None = None
        self._clock_sent = 0.0

    def put(
        self,
        event: Event,
        on_sent: Callable[[], None] | None = None,
        pcm: np.ndarray | None = None,
        rate: int = 0,
    ) -> None:
        if event["type"] not in _AUDIO:
            self._on_event(event)
        elif event.get("item_id") != self._cleared:
            super().put(event, on_sent, pcm, rate)

    def interrupt(self, response_id: str | None) -> str | None:
        """Barge-in: drop the audio not sent yet and, if the carrier holds some, send `clear` first.
        Returns the id of the item cut short (None if the caller heard all that was generated)."""
        queued = [q.event["item_id"] for q in self._queue if q.event["type"] == _DELTA]
        framed = [f.item_id for f in self._frames if f.payload]
        if not (queued or framed or self.playout.playing):
            return None
        self.drop(lambda e: e["type"] not in _AUDIO)  # never sent: never played
        self._frames.clear()
        self._item, self._leftover, self._unmarked = None, b"", []
        self._clock_start, self._clock_sent = None, 0.0
        item = self.playout.clear()
        if item is not None:
            self._control.append(clear_message(self.stream_sid).wire())
            self._wake.set()
        self._cleared = item or (framed or queued)[0]
        return self._cleared

    async def run(self) -> None:
        """Write until `close()`: control messages first, then frames on the playback clock."""
        while True:
            if self.failure is not None:  # the carrier stopped reading (see Outbox)
                raise self.failure
            if self._control:
                await self._send_text(self._control.popleft())
            elif self._closing:  # the call is over: queued audio has no one to play to
                return
            elif not self._frames and self._queue:
                self._frame(self._pop())
            elif self._frames:
                lead = self._lead() if self._frames[0].payload else 0.0
                if lead > self._ahead_s:
                    await self._nap(lead - self._ahead_s)
                else:
                    await self._send(self._frames.popleft())
            else:
                self._wake.clear()
                await self._wake.wait()

    def abandon(self) -> None:
        # `on_event` is the call's bound method and the call holds this outbox: a cycle (with the
        # session and its audio) that only the cyclic GC would free once the call is over
        super().abandon()
        self._on_event = _ignore
        self._control.clear()
        self._frames.clear()
        self._unmarked = []
        self.playout.clear()

    # ---- framing -------------------------------------------------------------------------------
    def _frame(self, q: Queued) -> None:
        """One audio event -> frames, the last closed by a mark; a partial frame waits for the next."""
        item = q.event["item_id"]
        if q.event["type"] != _DELTA:  # output_audio.done: the item's audio ends here
            if item == self._item:
                self._end_item()
            return
        if item != self._item:
            self._end_item()
            self._item = item
        if q.on_sent is not None:
            self._unmarked.append(q.on_sent)
        data = self._leftover + base64.b64decode(q.event["delta"])
        whole = len(data) - len(data) % FRAME_BYTES
        self._leftover = data[whole:]
        for i in range(0, whole, FRAME_BYTES):
            self._frames.append(_Frame(item, data[i : i + FRAME_BYTES]))
        if whole:
            self._close_mark()

    def _close_mark(self) -> None:
        last = self._frames[-1]
        last.mark, last.on_played = True, self._unmarked
        self._unmarked = []

    def _end_item(self) -> None:
        if self._item is None:
            return
        if self._leftover:
            self._frames.append(_Frame(self._item, self._leftover.ljust(FRAME_BYTES, ULAW_SILENCE)))
            self._close_mark()
        elif self._unmarked:
            self._frames.append(_Frame(self._item, b""))
            self._close_mark()
        self._item, self._leftover = None, b""

    # ---- sending -------------------------------------------------------------------------------
    async def _send(self, frame: _Frame) -> None:
        if frame.payload:
            self.playout.sent_audio(frame.item_id)
            self._clock_sent += FRAME_S
            self.frames_sent += 1
            await self._send_text(media_message(self.stream_sid, frame.payload).wire())
        if frame.mark and frame.item_id != self._cleared:  # a barge-in while sending: nothing to mark
            name = self.playout.sent_mark(frame.item_id, tuple(frame.on_played))
            await self._send_text(mark_message(self.stream_sid, name).wire())

    def _lead(self) -> float:
        """Seconds of audio sent beyond what the carrier has played, if it plays from the first frame;
        a carrier that ran dry restarts the clock."""
        now = time.monotonic()
        if self._clock_start is None:
            self._clock_start = now
        lead = self._clock_sent - (now - self._clock_start)
        if lead < 0:
            self._clock_start, self._clock_sent, lead = now, 0.0, 0.0
        return lead

    async def _nap(self, seconds: float) -> None:
        """Sleep, woken early by new events (a barge-in, more audio, close)."""
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)
