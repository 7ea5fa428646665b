"""Realtime load over the telephony bridge: each session a Twilio Media Streams call to
`/v1/telephony/twilio`, behaving as Twilio does.

A call sends `connected` and `start` (customParameters fix the output lengths and the VAD's silence),
then the caller's audio as u-law 20 ms `media` frames on an absolute clock: the speech clip, then
silence until the answer has played, then the next turn; `stop` at the end. Outgoing audio plays on a
simulated 8 kHz player: a `mark` is echoed once the audio before it has played; on `clear` the player
drops its audio and echoes the pending marks at once. Per turn, on one monotonic clock:

- voice-to-voice: the first `media` frame after the end of the speech - the end of the speech (it
  includes the VAD's silence wait; Twilio has no speech_stopped, so no split into parts);
- stall: the longest wait of a player that starts at the first frame (bench.metrics.playback_stall).

With `--api-key`, each call first fetches the TwiML webhook with the key, as Twilio does, and sends
the one-use stream token it holds in its `start` (a server with keys refuses streams without one).

Twilio has no end-of-response message: a turn ends once the player has played all the answer, known
from `audio_frames` when it is fixed (80 ms each), else when no media has come for QUIET_S (a slow
server that pauses longer mid-answer gets interrupted by the next turn).
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any
from xml.etree import ElementTree as ET

import httpx
import numpy as np
import soxr
import websockets

from omnivoice.audio.formats import G711_ULAW
from omnivoice.bench.realtime_load import RATE, RealtimeLoadConfig, TurnRecord

ULAW_RATE = 8000
FRAME_BYTES = 160  # 20 ms
FRAME_S = FRAME_BYTES / ULAW_RATE
QUIET_S = 2.0
CODEC_FRAME_S = 0.08


def to_ulaw(pcm16: bytes) -> bytes:
    """24 kHz pcm16 -> 8 kHz u-law, padded with silence to whole 20 ms frames."""
    x = np.frombuffer(pcm16, dtype="<i2").astype(np.float32) / 32768.0
    out = G711_ULAW.encode(soxr.resample(x, RATE, ULAW_RATE))
    return out + b"\xff" * (-len(out) % FRAME_BYTES)


class TwilioCaller:
    """One call: a sender streaming the caller's frames (and echoing due marks), a reader playing the
    answer out and filling the current TurnRecord."""

    def __init__(self, cfg: RealtimeLoadConfig, index: int, on_turn: Callable[[TurnRecord], None]) -> None:
        self.cfg = cfg
        self.index = index
        self.on_turn = on_turn
        self.turn: TurnRecord | None = None
        self.stream_sid = "MZ" + uuid.uuid4().hex
        self._speech = to_ulaw(cfg.speech)
        self._seq = 0
        self._chunk = 0
        self._marks: deque[tuple[float, str]] = deque()  # (when played, name), to echo
        self._play_end = 0.0  # when the player will have played all it got
        self._last_media = 0.0

    async def run(self) -> None:
        token = await self._stream_token() if self.cfg.api_key else None
        async with websockets.connect(self.cfg.url, max_size=None) as ws:
            await ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
            start = self._start(token)
            await self._send(ws, {"event": "start", "start": start, "streamSid": self.stream_sid})
            reader = asyncio.create_task(self._read(ws))
            try:
                await self._speak(ws)
                await self._send(ws, {"event": "stop", "streamSid": self.stream_sid, "stop": {}})
            finally:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)

    async def _stream_token(self) -> str | None:
        """The one-use stream token of the TwiML webhook (what Twilio fetches before the stream)."""
        twiml = self.cfg.url.replace("wss://", "https://", 1).replace("ws://", "http://", 1) + "/twiml"
        async with httpx.AsyncClient(timeout=30) as client:
            r = await client.get(twiml, headers={"Authorization": f"Bearer {self.cfg.api_key}"})
        r.raise_for_status()
        for param in ET.fromstring(r.text).iter("Parameter"):
            if param.get("name") == "omnivoice_token":
                return param.get("value")
        return None

    def _start(self, token: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"silence_duration_ms": self.cfg.silence_ms}
        if token:
            params["omnivoice_token"] = token
        if self.cfg.max_output_tokens:
            params["max_output_tokens"] = self.cfg.max_output_tokens
        if self.cfg.audio_frames:
            params["output_audio_frames"] = self.cfg.audio_frames
            params["min_output_tokens"] = self.cfg.max_output_tokens or 0
        if self.cfg.speculative is not None:
            params["speculative_response"] = "true" if self.cfg.speculative else "false"
        return {
            "streamSid": self.stream_sid,
            "accountSid": "AC" + "0" * 32,
            "callSid": "CA" + uuid.uuid4().hex,
            "tracks": ["inbound"],
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": ULAW_RATE, "channels": 1},
            "customParameters": {k: str(v) for k, v in params.items()},
        }

    async def _send(self, ws: Any, message: dict[str, Any]) -> None:
        self._seq += 1
        await ws.send(json.dumps({**message, "sequenceNumber": str(self._seq)}))

    async def _speak(self, ws: Any) -> None:
        clock = time.monotonic()
        silence = b"\xff" * FRAME_BYTES
        for n in range(self.cfg.turns):
            turn = self.turn = TurnRecord(self.index, n)
            for i in range(0, len(self._speech), FRAME_BYTES):
                clock = await self._media_at(ws, self._speech[i : i + FRAME_BYTES], clock)
            turn.speech_end = time.monotonic()
            deadline = turn.speech_end + self.cfg.turn_timeout_s
            while not self._answered(turn):
                if time.monotonic() > deadline:
                    turn.error = "timeout"
                    break
                clock = await self._media_at(ws, silence, clock)
            turn.done = time.monotonic()
            turn.status = "played" if turn.error is None else None
            gap_end = time.monotonic() + self.cfg.gap_s
            while time.monotonic() < gap_end:
                clock = await self._media_at(ws, silence, clock)
            self.on_turn(turn)

    def _answered(self, turn: TurnRecord) -> bool:
        now = time.monotonic()
        if turn.first_audio is None or now < self._play_end:
            return False
        if self.cfg.audio_frames:  # the answer's length is known (less the resampler's few ms)
            return sum(s for _, s in turn.chunks) >= self.cfg.audio_frames * CODEC_FRAME_S - 0.1
        return now - self._last_media >= QUIET_S

    async def _media_at(self, ws: Any, frame: bytes, clock: float) -> float:
        """Send one frame at `clock` (absolute schedule: no drift), and the marks played by then;
        returns the next frame's time."""
        delay = clock - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        self._chunk += 1
        media = {"track": "inbound", "chunk": str(self._chunk), "timestamp": str(self._chunk * 20)}
        media["payload"] = base64.b64encode(frame).decode()
        await self._send(ws, {"event": "media", "streamSid": self.stream_sid, "media": media})
        now = time.monotonic()
        while self._marks and self._marks[0][0] <= now:
            name = self._marks.popleft()[1]
            await self._send(ws, {"event": "mark", "streamSid": self.stream_sid, "mark": {"name": name}})
        return clock + FRAME_S

    async def _read(self, ws: Any) -> None:
        async for text in ws:
            message, now = json.loads(text), time.monotonic()
            kind = message.get("event")
            if kind == "media":
                seconds = len(base64.b64decode(message["media"]["payload"])) / ULAW_RATE
                self._play_end = max(self._play_end, now) + seconds
                self._last_media = now
                turn = self.turn
                if turn is not None and turn.speech_end and turn.done is None:
                    turn.first_audio = turn.first_audio or now
                    turn.chunks.append((now, seconds))
            elif kind == "mark":
                self._marks.append((self._play_end, message["mark"]["name"]))
            elif kind == "clear":  # the player drops its audio; pending marks come back at once
                self._play_end = now
                self._marks = deque((now, name) for _, name in self._marks)
