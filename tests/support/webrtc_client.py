"""An aiortc client peer for tests: a microphone track that says what it is given (at real-time
pace, silence in between), the received audio with its level per 20 ms frame, and the events of the
`oai-events` data channel."""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import json
import time
from collections import deque
from typing import Any

import httpx
import numpy as np
import soxr
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame

from omnivoice.server.webrtc.tracks import frame_to_mono

RATE = 48000
FRAME = 960
SILENT_RMS = 1e-3  # Opus-coded digital silence decodes to well below this


class MicTrack(MediaStreamTrack):
    """The client's microphone: plays what `say` queues, 20 ms at a time in real time."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._queue: deque[np.ndarray] = deque()
        self._pts: int | None = None
        self._start = 0.0
        self.drained = asyncio.Event()

    def say(self, pcm: np.ndarray, rate: int) -> None:
        """Queue mono float32 audio at `rate`."""
        x = soxr.resample(pcm.astype(np.float32), rate, RATE) if rate != RATE else pcm
        samples = (np.clip(x, -1, 1) * 32767).astype(np.int16)
        for i in range(0, samples.size, FRAME):
            self._queue.append(samples[i : i + FRAME])
        self.drained.clear()

    async def recv(self) -> AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = time.monotonic()
        if self._pts is None:
            self._start, self._pts = now, 0
        else:
            self._pts += FRAME
            wait = self._start + self._pts / RATE - now
            if wait > 0:
                await asyncio.sleep(wait)
        out = np.zeros(FRAME, np.int16)
        if self._queue:
            chunk = self._queue.popleft()
            out[: chunk.size] = chunk
        else:
            self.drained.set()
        frame = AudioFrame(format="s16", layout="mono", samples=FRAME)
        frame.planes[0].update(out.tobytes())
        frame.pts, frame.sample_rate, frame.time_base = self._pts, RATE, fractions.Fraction(1, RATE)
        return frame


class ClientCall:
    """One call from the client's side; `await connect(...)` returns it connected."""

    def __init__(self) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.mic = MicTrack()
        self.channel = self.pc.createDataChannel("oai-events")
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.frames: list[tuple[float, float]] = []  # (arrival, rms) of each received audio frame
        self.call_id = ""
        self._seen = 0
        self._new = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self.pc.addTrack(self.mic)
        self.channel.on("message", self._on_message)
        self.pc.on("track", self._on_track)

    def _on_message(self, message: str) -> None:
        self.events.append((time.monotonic(), json.loads(message)))
        self._new.set()

    def _on_track(self, track: MediaStreamTrack) -> None:
        self._tasks.append(asyncio.create_task(self._listen(track)))

    async def _listen(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            assert isinstance(frame, AudioFrame)  # the track is audio
            pcm = frame_to_mono(frame)
            self.frames.append((time.monotonic(), float(np.sqrt(np.mean(pcm**2)))))

    def send(self, event: dict[str, Any]) -> None:
        self.channel.send(json.dumps(event))

    async def next(self, kind: str, timeout: float = 30.0) -> dict[str, Any]:
        """The next event of type `kind` after those already returned; fails on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            for n in range(self._seen, len(self.events)):
                if self.events[n][1]["type"] == kind:
                    self._seen = n + 1
                    return self.events[n][1]
            left = deadline - time.monotonic()
            if left <= 0:
                got = [e["type"] for _, e in self.events[self._seen :]]
                raise AssertionError(f"no {kind} within {timeout} s; got {got}")
            self._new.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._new.wait(), left)

    async def first(self, kind: str, timeout: float = 30.0) -> dict[str, Any]:
        """The first event of type `kind` received, whenever it came (waiting for it): for events with
        no order between them, such as a short answer's `response.done` and the start of its playback.
        `next`'s position stays."""
        deadline = time.monotonic() + timeout
        while (found := next((e for _, e in self.events if e["type"] == kind), None)) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {kind} within {timeout} s; got {self.types()}")
            self._new.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._new.wait(), left)
        return found

    def time_of(self, event: dict[str, Any]) -> float:
        return next(t for t, e in self.events if e is event)

    def types(self) -> list[str]:
        return [e["type"] for _, e in self.events]

    def audible_ms(self, since: float = 0.0, until: float = float("inf")) -> int:
        """Milliseconds of received audio above silence that arrived in [since, until)."""
        return 20 * sum(1 for t, rms in self.frames if since <= t < until and rms > SILENT_RMS)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.pc.close()


async def connect(base_url: str, token: str | None = None, timeout: float = 30.0) -> ClientCall:
    """Offer, post it to /v1/realtime/calls, apply the answer, wait until the data channel is open."""
    call = ClientCall()
    try:
        await call.pc.setLocalDescription(await call.pc.createOffer())
        headers = {"Content-Type": "application/sdp"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        async with httpx.AsyncClient(timeout=timeout) as http:
            r = await http.post(
                f"{base_url}/v1/realtime/calls", content=call.pc.localDescription.sdp, headers=headers
            )
        assert r.status_code == 201, r.text
        assert r.headers["content-type"].startswith("application/sdp")
        call.call_id = r.headers["location"].rsplit("/", 1)[-1]
        await call.pc.setRemoteDescription(RTCSessionDescription(sdp=r.text, type="answer"))
        opened = asyncio.Event()
        if call.channel.readyState == "open":
            opened.set()
        call.channel.on("open", opened.set)
        await asyncio.wait_for(opened.wait(), timeout)
    except BaseException:
        await call.close()
        raise
    return call
