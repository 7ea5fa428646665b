"""One WebRTC call: an aiortc peer connection around one realtime session.

The offer/answer follows aiortc's examples/server: setRemoteDescription, add our track, createAnswer,
setLocalDescription (aiortc gathers its candidates there, so the answer is complete; no trickle ICE).
Then `run` waits for the connection (or gives up after the ICE timeout) and serves the session: the
microphone's audio and the data channel's events go through one inbox, handled in order, as the
WebSocket's read loop does. The call ends on hang-up, on a failed or closed connection, when the
data channel closes, or at shutdown; `close` releases everything, whatever ended it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
from aiortc import RTCConfiguration, RTCDataChannel, RTCPeerConnection, RTCSessionDescription
from aiortc.exceptions import InvalidAccessError, InvalidStateError, OperationError
from aiortc.mediastreams import MediaStreamTrack

from omnivoice.audio.resample import StreamResampler
from omnivoice.server.session import protocol as p
from omnivoice.server.session.conversation import INPUT_RATE
from omnivoice.server.session.server_events import error
from omnivoice.server.session.session import Session
from omnivoice.server.webrtc.channel import LABEL, ChannelClosed, DataChannelOutbox
from omnivoice.server.webrtc.tracks import read_microphone

log = logging.getLogger(__name__)


class OfferError(ValueError):
    """An SDP offer that aiortc cannot parse or answer (a 400); the message says why."""


# aiortc's SDP parser and offer/answer code fail on malformed offers with whatever the bad line causes
# (a KeyError for an unknown a=setup, StopIteration for an unknown payload type, an AttributeError for
# a missing transport, aiortc's OperationError for an audio section with no codec it can map, ...): all
# of these are the offer's fault, none the server's.
_AIORTC_OFFER_ERRORS = (
    ValueError, LookupError, AssertionError, AttributeError, TypeError, RuntimeError,
    InvalidAccessError, InvalidStateError, OperationError,
)  # fmt: skip


@dataclass(frozen=True)
class MicAudio:
    """Microphone audio as it was decoded: mono float32 at `rate`."""

    pcm: np.ndarray
    rate: int


class Inbox:
    """What the client sent, in arrival order: microphone audio and event texts."""

    def __init__(self) -> None:
        self._items: deque[MicAudio | str] = deque()
        self.wake = asyncio.Event()

    def put(self, item: MicAudio | str) -> None:
        self._items.append(item)
        self.wake.set()

    def put_audio(self, pcm: np.ndarray, rate: int) -> None:
        self.put(MicAudio(pcm, rate))

    def take(self) -> MicAudio | str | None:
        """The next event text, or the audio queued before the next event (of one rate) as one."""
        if not self._items:
            self.wake.clear()
            return None
        first = self._items.popleft()
        if isinstance(first, str):
            return first
        audio = [first.pcm]
        while self._items and isinstance(nxt := self._items[0], MicAudio) and nxt.rate == first.rate:
            audio.append(self._items.popleft().pcm)  # type: ignore[union-attr]
        return MicAudio(np.concatenate(audio), first.rate) if len(audio) > 1 else first


class Call:
    def __init__(self, call_id: str, session: Session, outbox: DataChannelOutbox) -> None:
        self.id = call_id
        self.session = session
        self.outbox = outbox
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))  # host candidates: no STUN lookups
        self.end_reason: str | None = None
        self._inbox = Inbox()
        self._connected = asyncio.Event()
        self._ended = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._writer: asyncio.Task[None] | None = None
        self._full_reported = False
        self._mic: StreamResampler | None = None  # the microphone's audio to 16 kHz
        self._has_channel = False
        self.pc.on("connectionstatechange", self._on_state)
        self.pc.on("track", self._on_track)
        self.pc.on("datachannel", self._on_datachannel)

    def __repr__(self) -> str:
        return self.label

    @property
    def label(self) -> str:
        """How logs name the call: a string, so a log record never keeps the call alive."""
        return f"call {self.id} (session {self.session.id})"

    async def answer(self, offer_sdp: str) -> str:
        """The SDP answer to the client's offer; raises OfferError for an offer aiortc cannot take."""
        self._has_channel = "m=application" in offer_sdp
        try:
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
            self.pc.addTrack(self.outbox.track)
            await self.pc.setLocalDescription(await self.pc.createAnswer())
        except _AIORTC_OFFER_ERRORS as e:
            log.info("%s: offer refused: %r", self.label, e)
            raise OfferError(str(e) or type(e).__name__) from None
        return self.pc.localDescription.sdp

    def hang_up(self, reason: str) -> None:
        if self.end_reason is None:
            self.end_reason = reason
        self._ended.set()
        self._inbox.wake.set()

    async def run(self, connect_timeout_s: float) -> None:
        """Serve the call until it ends. Returns early if ICE does not complete in time."""
        connected = asyncio.create_task(self._connected.wait())
        ended = asyncio.create_task(self._ended.wait())
        try:
            await asyncio.wait((connected, ended), timeout=connect_timeout_s, return_when="FIRST_COMPLETED")
        finally:
            connected.cancel()
            ended.cancel()
        if not self._connected.is_set():
            self.hang_up(f"not connected within {connect_timeout_s:g} s (ICE did not complete)")
            return
        log.info("%s connected", self.label)
        if self._writer is None and not self._has_channel:
            self.outbox.discard = True
            self._writer = self._spawn(self.outbox.run(), f"writer-{self.id}")
        self.session.start()
        while not self._ended.is_set():
            got = self._inbox.take()
            if got is None:
                await self._inbox.wake.wait()
            elif isinstance(got, str):
                await self.session.handle(got)
            else:
                await self._append(got)

    async def _append(self, audio: MicAudio) -> None:
        if self._mic is None or self._mic.in_rate != audio.rate:
            self._mic = StreamResampler(audio.rate, INPUT_RATE)
        try:  # resampled in the session's worker thread, with the VAD
            await self.session.append_audio(audio.pcm, convert=self._mic.process)
            self._full_reported = False
        except p.ProtocolError as e:  # the buffer is full (push-to-talk and no commit): say so once
            if not self._full_reported:
                self.outbox.put(error(e.message, e.code, e.param))
                self._full_reported = True

    # ---- peer connection events ----------------------------------------------------------------
    def _on_state(self) -> None:
        state = self.pc.connectionState
        log.debug("%s: connection %s", self.label, state)
        if state == "connected":
            self._connected.set()
        elif state in ("failed", "closed"):
            self.hang_up(f"connection {state}")

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind != "audio":
            return
        self._spawn(read_microphone(track, self._inbox.put_audio), f"mic-{self.id}")

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        if channel.label != LABEL or self._writer is not None:
            log.info("%s: ignoring data channel %r", self.label, channel.label)
            return
        self.outbox.channel = channel
        channel.on("message", self._on_message)
        channel.on("close", lambda: self.hang_up("data channel closed"))
        self._writer = self._spawn(self.outbox.run(), f"writer-{self.id}")

    def _on_message(self, message: str | bytes) -> None:
        self._inbox.put(message if isinstance(message, str) else message.decode("utf-8", "replace"))

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if isinstance(exc, ChannelClosed):
            # the client closed its data channel (the page's Stop) while events were going out: a
            # hang-up, seen by the writer before the channel's close event
            log.debug("%r: the data channel closed under %s", self, task.get_name())
            self.hang_up("data channel closed")
        elif exc is not None:  # expected once the call is ending (the connection closed under a task)
            level = logging.DEBUG if self._ended.is_set() else logging.WARNING
            log.log(level, "%r: task %s failed: %r", self, task.get_name(), exc)
            self.hang_up(f"{task.get_name()} failed")
        elif task is self._writer:
            self._writer = None

    # ---- teardown ------------------------------------------------------------------------------
    async def close(self) -> None:
        """Release everything: the response in every engine stage, the tasks, the peer connection."""
        self.hang_up("closed")
        try:
            await self.session.close()
        except Exception:
            log.exception("%s: closing the session failed", self.label)
        writer = self._writer
        if writer is not None:
            self.outbox.close()  # flush the last events (response.done) while the channel is up
            await asyncio.wait([writer], timeout=1.0)  # not wait_for: see realtime/ending.py
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.outbox.track.stop()
        self.outbox.abandon()
        try:
            await self.pc.close()
        except Exception:
            log.exception("%s: closing the peer connection failed", self.label)
