"""The one writer of a session's socket: server events queue here and leave in order.

Producers (the event handler, the response task) never await the socket, so cancelling a response
never cuts a frame in half, and a barge-in can drop audio deltas still queued (`drop`). Events are
built in the GA dialect; a beta client (`OpenAI-Beta: realtime=v1`) gets the beta names.

The WebSocket sends every event as text. A transport that plays the audio out itself (WebRTC)
subclasses this and overrides `write` (audio deltas go to its track), `interrupt` and `clear_output`.

A client that stops reading is dropped, never waited for: a send blocked `send_timeout_s`, or more
than `max_bytes` queued, makes `run` raise SlowConsumer (the connection then ends the session,
which aborts its response in every engine stage).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from omnivoice.config import Profile

log = logging.getLogger(__name__)

Event = dict[str, Any]
_BETA_TYPES = {
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
    "conversation.item.added": "conversation.item.created",
}
_BETA_DROPPED = {"conversation.item.done"}
_BETA_CONTENT = {"output_audio": "audio", "output_text": "text"}


def to_beta(event: Event) -> Event | None:
    """The beta form of a GA event; None for events the beta protocol does not have."""
    kind = event["type"]
    if kind in _BETA_DROPPED:
        return None
    out = {**event, "type": _BETA_TYPES.get(kind, kind)}
    for key in ("item", "part"):
        if isinstance(out.get(key), dict):
            out[key] = _beta_content(out[key])
    if isinstance(out.get("response"), dict) and out["response"].get("output"):
        out["response"] = {**out["response"], "output": [_beta_content(i) for i in out["response"]["output"]]}
    return out


def _beta_content(obj: dict[str, Any]) -> dict[str, Any]:
    if "content" in obj:
        return {**obj, "content": [_beta_content(c) for c in obj["content"]]}
    if obj.get("type") in _BETA_CONTENT:
        return {**obj, "type": _BETA_CONTENT[obj["type"]]}
    return obj


class Queued(NamedTuple):
    event: Event
    on_sent: Callable[[], None] | None
    pcm: np.ndarray | None  # an audio delta's audio: float32 at the output format's rate
    rate: int
    size: int = 0  # bytes it takes on the wire, about (see `_wire_size`)


@dataclass(frozen=True)
class OutboxLimits:
    """How far a client may fall behind before it is dropped (realtime.max_outbox_bytes and
    server.send_timeout_s of the profile)."""

    max_bytes: int = 8 * 1024 * 1024
    send_timeout_s: float = 10.0

    @classmethod
    def of(cls, profile: Profile) -> OutboxLimits:
        return cls(profile.realtime.max_outbox_bytes, profile.server.send_timeout_s)


class SlowConsumer(Exception):
    """The client stopped reading: a send blocked too long, or too much is queued for it."""


def _wire_size(event: Event) -> int:
    # audio (a delta's base64, an item's) is what piles up; the rest is small
    delta = event.get("delta")
    return 256 + (len(delta) if isinstance(delta, str) else 0)


class Outbox:
    def __init__(
        self,
        send_text: Callable[[str], Awaitable[None]],
        session_id: str,
        beta: bool,
        limits: OutboxLimits | None = None,
    ) -> None:
        self._raw_send = send_text
        self.session_id = session_id  # of the session it serves
        self.beta = beta
        self.limits = limits or OutboxLimits()
        self._queue: deque[Queued] = deque()
        self._queued_bytes = 0
        self.failure: SlowConsumer | None = None
        self.failed = asyncio.Event()  # set with `failure` (the writer may be stuck in a send)
        self._wake = asyncio.Event()
        self._closing = False

    def put(
        self,
        event: Event,
        on_sent: Callable[[], None] | None = None,
        pcm: np.ndarray | None = None,
        rate: int = 0,
    ) -> None:
        """Queue `event` (an `event_id` is added); `on_sent` runs once it is on the socket (or, for
        audio a transport plays out itself, once played). `pcm` at `rate` is an audio delta's audio."""
        event.setdefault("event_id", f"event_{uuid.uuid4().hex[:20]}")
        size = _wire_size(event)
        self._queue.append(Queued(event, on_sent, pcm, rate, size))
        self._queued_bytes += size
        if self._queued_bytes > self.limits.max_bytes and len(self._queue) > 1 and self.failure is None:
            self.failure = SlowConsumer(
                f"{self._queued_bytes} bytes of events wait for the client (limit {self.limits.max_bytes})"
            )
            self.failed.set()
        self._wake.set()

    def _pop(self) -> Queued:
        q = self._queue.popleft()
        self._queued_bytes -= q.size
        return q

    def drop(self, keep: Callable[[Event], bool]) -> int:
        """Remove queued events for which `keep` is false; returns how many were removed."""
        before = len(self._queue)
        self._queue = deque(e for e in self._queue if keep(e.event))
        self._queued_bytes = sum(q.size for q in self._queue)
        return before - len(self._queue)

    async def _send_text(self, text: str) -> None:
        """Send one message; SlowConsumer if the client has not taken it within the send timeout."""
        try:
            async with asyncio.timeout(self.limits.send_timeout_s):
                await self._raw_send(text)
        except TimeoutError:
            timeout = self.limits.send_timeout_s
            raise SlowConsumer(f"the client took nothing for {timeout:g} s") from None

    def interrupt(self, response_id: str | None) -> str | None:
        """The user spoke over the output (server VAD, `interrupt_response`); `response_id` is the
        response in flight, if any. Over a WebSocket the client owns playout: nothing to do here.
        A transport that plays out itself stops at once and returns the id of the item whose audio
        it cut short."""
        return None

    def clear_output(self, response_id: str | None) -> None:
        """`output_audio_buffer.clear`: drop the audio not yet sent."""
        self.drop(lambda ev: ev["type"] != "response.output_audio.delta")
        self.put({"type": "output_audio_buffer.cleared", "response_id": response_id})

    async def write(self, q: Queued) -> None:
        """Send one event (beta-renamed for beta clients), then run its `on_sent`."""
        wire = to_beta(q.event) if self.beta else q.event
        if wire is not None:
            await self._send_text(json.dumps(wire, separators=(",", ":")))
        if q.on_sent is not None:
            q.on_sent()

    async def run(self) -> None:
        """Write queued events until `close()`; raises if the socket fails, SlowConsumer if the client
        stopped reading."""
        while True:
            while self._queue:
                if self.failure is not None:
                    raise self.failure
                await self.write(self._pop())
            if self.failure is not None:
                raise self.failure
            if self._closing:
                return
            self._wake.clear()
            await self._wake.wait()

    def close(self) -> None:
        """Let `run` return once the queue is empty."""
        self._closing = True
        self._wake.set()

    def abandon(self) -> None:
        """The connection is over and the writer gone: drop what was never sent, the callbacks that
        came with it and the send function (a subclass's own bound method: a cycle), so nothing here
        keeps the session alive."""
        self._queue.clear()
        self._queued_bytes = 0
        self._raw_send = _gone


async def _gone(text: str) -> None:
    raise ConnectionError("the connection is over")
