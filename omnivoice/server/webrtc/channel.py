"""The session's outbox on a WebRTC call: events on the `oai-events` data channel, audio on the track.

Same events as the WebSocket, GA dialect, except that audio deltas never go on the channel: their
audio is queued on the `PlayoutTrack`, which plays it in real time and reports it played. A
barge-in (`interrupt`) or `output_audio_buffer.clear` drops the queued audio at once.
"""

from __future__ import annotations

from aiortc import RTCDataChannel

from omnivoice.server.session.outbox import Outbox, OutboxLimits, Queued, SlowConsumer
from omnivoice.server.webrtc.tracks import PlayoutTrack

LABEL = "oai-events"
AUDIO_DELTA = "response.output_audio.delta"


class ChannelClosed(Exception):
    pass


class DataChannelOutbox(Outbox):
    def __init__(self, session_id: str, limits: OutboxLimits | None = None) -> None:
        super().__init__(self._send, session_id, beta=False, limits=limits)
        self.channel: RTCDataChannel | None = None  # set once the client's channel is open
        self.discard = False  # a call without a data channel: events have nowhere to go
        self.track = PlayoutTrack(self._emit_playout)

    def _emit_playout(self, event: dict) -> None:
        self.put(event)

    async def _send(self, text: str) -> None:
        if self.discard:
            return
        if self.channel is None or self.channel.readyState != "open":
            raise ChannelClosed(f"the {LABEL} data channel is closed")
        if self.channel.bufferedAmount > self.limits.max_bytes:  # SCTP buffers what the peer has not taken
            raise SlowConsumer(f"{self.channel.bufferedAmount} bytes wait on the {LABEL} data channel")
        self.channel.send(text)  # buffered by SCTP; never blocks

    async def write(self, q: Queued) -> None:
        event = q.event
        kind = event["type"]
        if kind == AUDIO_DELTA:
            if q.pcm is not None:
                self.track.play(event["response_id"], event["item_id"], q.pcm, q.rate, q.on_sent)
            return
        if kind == "response.done":
            self.track.finish(event["response"]["id"])
        await super().write(q)

    def interrupt(self, response_id: str | None) -> str | None:
        self.drop(lambda ev: ev["type"] != AUDIO_DELTA)  # audio still queued here never reaches the track
        return self.track.clear(response_id)

    def clear_output(self, response_id: str | None) -> None:
        self.drop(lambda ev: ev["type"] != AUDIO_DELTA)
        if self.track.clear(response_id) is None:  # nothing was playing: confirm all the same
            self.put({"type": "output_audio_buffer.cleared", "response_id": response_id})
