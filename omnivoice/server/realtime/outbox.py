"""The one writer of a session's socket: server events queue here and leave in order.

Producers (the event handler, the response task) never await the socket, so cancelling a response
never cuts a frame in half, and a barge-in can drop audio deltas still queued (`drop`). Events are
built in the GA dialect; a beta client (`OpenAI-Beta: realtime=v1`) gets the beta names.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

from starlette.websockets import WebSocket

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


class Outbox:
    def __init__(self, websocket: WebSocket, session_id: str, beta: bool) -> None:
        self._ws = websocket
        self._session_id = session_id
        self.beta = beta
        self._queue: deque[tuple[Event, Callable[[], None] | None]] = deque()
        self._wake = asyncio.Event()
        self._closing = False

    def put(self, event: Event, on_sent: Callable[[], None] | None = None) -> None:
        """Queue `event` (an `event_id` is added); `on_sent` runs once it is on the socket."""
        event.setdefault("event_id", f"event_{uuid.uuid4().hex[:20]}")
        self._queue.append((event, on_sent))
        self._wake.set()

    def drop(self, keep: Callable[[Event], bool]) -> int:
        """Remove queued events for which `keep` is false; returns how many were removed."""
        before = len(self._queue)
        self._queue = deque(e for e in self._queue if keep(e[0]))
        return before - len(self._queue)

    async def run(self) -> None:
        """Write queued events until `close()`; raises if the socket fails."""
        while True:
            while self._queue:
                event, on_sent = self._queue.popleft()
                wire = to_beta(event) if self.beta else event
                if wire is not None:
                    await self._ws.send_text(json.dumps(wire, separators=(",", ":")))
                if on_sent is not None:
                    on_sent()
            if self._closing:
                return
            self._wake.clear()
            await self._wake.wait()

    def close(self) -> None:
        """Let `run` return once the queue is empty."""
        self._closing = True
        self._wake.set()
