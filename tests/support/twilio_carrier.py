"""The carrier's side of a Twilio Media Stream, for tests: the exact messages Twilio sends (as in its
docs), and every message the server sends back, recorded with its arrival time."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import soxr
import websockets

from omnivoice.audio.formats import G711_ULAW

FRAME = 160  # 20 ms of 8 kHz u-law


def ulaw(*parts: np.ndarray | float, rate: int = 24000) -> bytes:
    """Audio (float32 arrays at `rate`) and silences (floats, seconds) as 8 kHz u-law bytes."""
    chunks = [np.zeros(int(p * rate), np.float32) if isinstance(p, float | int) else p for p in parts]
    return G711_ULAW.encode(soxr.resample(np.concatenate(chunks), rate, 8000))


class Carrier:
    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.stream_sid = "MZ" + uuid.uuid4().hex
        self.call_sid = "CA" + uuid.uuid4().hex
        self.messages: list[tuple[float, dict[str, Any]]] = []
        self.closed = asyncio.Event()
        self._seq = 0
        self._chunk = 0
        self._seen = 0
        self._new = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for text in self.ws:
                self.messages.append((time.monotonic(), json.loads(text)))
                self._new.set()
        finally:
            self.closed.set()
            self._new.set()

    # ---- what Twilio sends ---------------------------------------------------------------------
    async def send(self, message: dict[str, Any]) -> None:
        self._seq += 1
        await self.ws.send(json.dumps({"sequenceNumber": str(self._seq), **message}))

    async def connected(self) -> None:
        await self.ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))

    async def start(self, **parameters: Any) -> None:
        start = {
            "accountSid": "AC" + "0" * 32,
            "streamSid": self.stream_sid,
            "callSid": self.call_sid,
            "tracks": ["inbound"],
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
            "customParameters": {k: str(v) for k, v in parameters.items()},
        }
        await self.send({"event": "start", "start": start, "streamSid": self.stream_sid})

    async def media(self, payload: bytes | str) -> None:
        self._chunk += 1
        data = payload if isinstance(payload, str) else base64.b64encode(payload).decode()
        media = {"track": "inbound", "chunk": str(self._chunk), "timestamp": str(20 * self._chunk)}
        await self.send({"event": "media", "media": {**media, "payload": data}, "streamSid": self.stream_sid})

    async def play(self, audio: bytes, pace: float = 0.0) -> None:
        """Send `audio` (u-law) in 20 ms frames, sleeping `pace` × real time between them."""
        for i in range(0, len(audio), FRAME):
            await self.media(audio[i : i + FRAME])
            await asyncio.sleep(pace * 0.02)

    async def mark(self, name: str) -> None:
        await self.send({"event": "mark", "streamSid": self.stream_sid, "mark": {"name": name}})

    async def dtmf(self, digit: str) -> None:
        dtmf = {"track": "inbound_track", "digit": digit}
        await self.send({"event": "dtmf", "streamSid": self.stream_sid, "dtmf": dtmf})

    async def stop(self) -> None:
        stop = {"accountSid": "AC" + "0" * 32, "callSid": self.call_sid}
        await self.send({"event": "stop", "streamSid": self.stream_sid, "stop": stop})

    # ---- what the server sent ------------------------------------------------------------------
    async def next(self, event: str, timeout: float = 20.0) -> dict[str, Any]:
        """The next message of kind `event` after those already returned by `next`."""
        deadline = time.monotonic() + timeout
        while True:
            for n in range(self._seen, len(self.messages)):
                if self.messages[n][1]["event"] == event:
                    self._seen = n + 1
                    return self.messages[n][1]
            left = deadline - time.monotonic()
            if left <= 0 or self.closed.is_set():
                got = [m["event"] for _, m in self.messages[self._seen :]]
                raise AssertionError(f"no {event} within {timeout} s; got {got}")
            self._new.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._new.wait(), left)

    def of(self, event: str) -> list[dict[str, Any]]:
        return [m for _, m in self.messages if m["event"] == event]

    def time_of(self, message: dict[str, Any]) -> float:
        return next(t for t, m in self.messages if m is message)

    def audio(self, before: dict[str, Any] | None = None) -> bytes:
        """The u-law received (up to `before`, a message, if given)."""
        out = []
        for _, m in self.messages:
            if m is before:
                break
            if m["event"] == "media":
                out.append(base64.b64decode(m["media"]["payload"]))
        return b"".join(out)

    async def close(self) -> None:
        await self.ws.close()
        await asyncio.gather(self._reader, return_exceptions=True)


@asynccontextmanager
async def call(base_url: str) -> AsyncIterator[Carrier]:
    """A Media Stream to the server at `base_url` (http://host:port)."""
    url = base_url.replace("http", "ws", 1) + "/v1/telephony/twilio"
    async with websockets.connect(url, max_size=None) as ws:
        carrier = Carrier(ws)
        try:
            yield carrier
        finally:
            await carrier.close()
