"""The client's side of a realtime session over the `openai` SDK: the SDK pointed at a server, every
server event recorded with its arrival time, audio appended in paced pieces."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from typing import Any

import openai
import websockets

from .speech import RATE


def client(url: str) -> openai.AsyncOpenAI:
    """The `openai` SDK against the server at `url` (no key needed, no retries)."""
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


class Recorder:
    """Reads every server event of a connection in the background, with its arrival time."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.events: list[tuple[float, Any]] = []
        self._seen = 0
        self._new = asyncio.Event()
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for event in self.conn:
            self.events.append((time.monotonic(), event))
            self._new.set()

    async def next(self, kind: str, timeout: float = 20.0) -> Any:
        """The next event of type `kind` after those already returned by `next`; fails on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            for n in range(self._seen, len(self.events)):
                if self.events[n][1].type == kind:
                    self._seen = n + 1
                    return self.events[n][1]
            left = deadline - time.monotonic()
            if left <= 0:
                got = [e.type for _, e in self.events[self._seen :]]
                raise AssertionError(f"no {kind} within {timeout} s; got {got}")
            self._new.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._new.wait(), left)

    async def first(self, kind: str, timeout: float = 20.0) -> Any:
        """The first event of type `kind` received, whenever it came (waiting for it): for events that
        run beside others, such as a transcript beside its response. `next`'s position stays."""
        deadline = time.monotonic() + timeout
        while (found := next((e for _, e in self.events if e.type == kind), None)) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {kind} within {timeout} s; got {self.types()}")
            self._new.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._new.wait(), left)
        return found

    def types(self) -> list[str]:
        return [e.type for _, e in self.events]

    def time_of(self, event: Any) -> float:
        return next(t for t, e in self.events if e is event)

    def audio(self, response_id: str | None = None) -> bytes:
        return b"".join(
            base64.b64decode(e.delta)
            for _, e in self.events
            if e.type == "response.output_audio.delta" and response_id in (None, e.response_id)
        )

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def send_audio(conn: Any, audio: bytes, chunk_ms: int = 20, pace: float = 0.0) -> None:
    """Append `audio` (pcm16 24 kHz) in `chunk_ms` pieces, sleeping `pace` × real time between them."""
    step = RATE * 2 * chunk_ms // 1000
    for i in range(0, len(audio), step):
        await conn.input_audio_buffer.append(audio=base64.b64encode(audio[i : i + step]).decode())
        await asyncio.sleep(pace * chunk_ms / 1000)


async def respond_to_text(base_url: str, text: str = "hi", timeout: float = 20.0) -> Any:
    """One session over the `openai` client at `base_url`: a user message saying `text`, then
    `response.create`; the `response.done` event's response."""
    async with client(base_url).realtime.connect(model="omnivoice") as conn:
        rec = Recorder(conn)
        await rec.next("session.created")
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
        await conn.conversation.item.create(item=item)  # type: ignore[arg-type]
        await conn.response.create()
        done = (await rec.next("response.done", timeout=timeout)).response
        await rec.close()
    return done


async def text_turn(url: str, session: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """One turn over a raw `/v1/realtime` WebSocket at `url`: apply `session`, say "hi" as text, ask for a
    response; the bytes of audio it streamed and its `response.done` object. An `error` event fails."""
    async with websockets.connect(url, max_size=None) as ws:
        await ask_text(ws, session)
        return await audio_until_done(ws)


async def ask_text(ws: Any, session: dict[str, Any]) -> None:
    """On a raw `/v1/realtime` WebSocket: apply `session`, say "hi" as text and ask for a response."""
    await ws.send(json.dumps({"type": "session.update", "session": session}))
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
    await ws.send(json.dumps({"type": "response.create"}))


async def audio_until_done(ws: Any, audio: int = 0) -> tuple[int, dict[str, Any]]:
    """Read a raw WebSocket's events to the next `response.done`: `audio` plus the bytes of audio
    streamed meanwhile, and the `response.done` object. An `error` event fails."""
    while True:
        event = json.loads(await ws.recv())
        assert event["type"] != "error", event
        if event["type"] == "response.output_audio.delta":
            audio += len(base64.b64decode(event["delta"]))
        elif event["type"] == "response.done":
            return audio, event["response"]
