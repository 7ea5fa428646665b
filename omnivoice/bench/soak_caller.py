"""Soak callers: `/v1/realtime` sessions that talk, barge in and hang up abruptly, over and over.

Each of `concurrency` callers opens a session, speaks a few turns and ends it, then opens the next,
until told to stop. The microphone streams continuously in 20 ms chunks at real-time pace (speech,
then silence), server VAD ends every turn. A turn is one of:

- normal: speak, listen until the answer's `response.done` (completed);
- barge-in: speak, and once the answer streams, speak again after a random wait: the answer should
  end `cancelled` / `turn_detected`; the caller truncates it at what it heard and listens to the next;
- abrupt disconnect: at a random point (mostly mid-answer, after a random wait past its first audio;
  sometimes while speaking or waiting for the answer) the TCP connection is aborted: no close frame.

Voice-to-voice latency (first audio delta - end of speech) is recorded for every answer that started
from silence, with the time it was seen, so the report can show drift across the run.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import websockets

from omnivoice.bench.realtime_load import CHUNK_MS, RATE

DISCONNECT_PHASES = ("speaking", "waiting", "streaming")


@dataclass(frozen=True)
class SoakConfig:
    url: str  # ws://host:port/v1/realtime?model=...
    speech: bytes  # pcm16 24 kHz mono
    concurrency: int = 4
    turns: tuple[int, int] = (1, 4)  # turns per session, drawn uniformly
    barge_in: float = 0.2  # share of turns with a barge-in
    disconnect: float = 0.4  # share of turns ended by an abrupt disconnect
    phase_weights: tuple[float, float, float] = (0.1, 0.1, 0.8)  # where a disconnect falls (PHASES)
    within_s: float = 2.0  # barge-ins and disconnects come up to this long after the first audio
    silence_ms: int = 500
    max_output_tokens: int | None = 32
    audio_frames: int | None = 60
    turn_timeout_s: float = 60.0
    gap_s: float = 0.3
    api_key: str | None = None
    seed: int = 0


@dataclass
class SoakTally:
    """What all callers did; the report is built from it."""

    t0: float = field(default_factory=time.monotonic)
    sessions_opened: int = 0
    sessions_closed: int = 0
    held: int = 0
    peak_held: int = 0
    turns_completed: int = 0
    barge_ins: int = 0  # answers cancelled by the caller's speech (turn_detected)
    barge_ins_late: int = 0  # the answer had ended before the caller's speech was detected
    disconnects: Counter[str] = field(default_factory=Counter)  # by phase
    disconnects_mid_response: int = 0  # the answer was created and not done when the socket went
    errors: Counter[str] = field(default_factory=Counter)
    latencies: list[tuple[float, float, float | None]] = field(default_factory=list)  # (t, v2v, resp)

    def error(self, kind: str) -> None:
        self.errors[kind] += 1


@dataclass
class _Answer:
    created: float
    item_id: str | None = None
    first_audio: float | None = None
    status: str | None = None
    reason: str | None = None


class TurnTimeout(Exception):
    pass


class _Session:
    """One connection: the sender's clock and a reader filling in what the server said."""

    def __init__(self, ws: Any, cfg: SoakConfig, tally: SoakTally) -> None:
        self.ws = ws
        self.cfg = cfg
        self.tally = tally
        self.answers: list[_Answer] = []
        self.stopped: list[float] = []
        self.clock = time.monotonic()
        self.step = RATE * 2 * CHUNK_MS // 1000

    async def read(self) -> None:
        async for message in self.ws:
            self._on_event(json.loads(message), time.monotonic())

    def _on_event(self, event: dict[str, Any], now: float) -> None:
        kind = event.get("type")
        if kind == "input_audio_buffer.speech_stopped":
            self.stopped.append(now)
        elif kind == "response.created":
            self.answers.append(_Answer(now))
        elif kind == "response.output_item.added" and self.answers:
            self.answers[-1].item_id = event["item"]["id"]
        elif kind == "response.output_audio.delta" and self.answers:
            a = self.answers[-1]
            a.first_audio = a.first_audio or now
        elif kind == "response.done" and self.answers:
            r, a = event["response"], self.answers[-1]
            a.status = r["status"]
            details = r.get("status_details") or {}
            a.reason = details.get("reason")
            if a.status == "failed":
                self.tally.error(f"response failed: {(details.get('error') or {}).get('code')}")
        elif kind == "error":
            self.tally.error(f"server error: {event['error'].get('code')}")

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(event))

    async def _chunk(self, pcm: bytes) -> None:
        delay = self.clock - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            self.clock = time.monotonic()  # fell behind (a loaded client): don't burst to catch up
        audio = base64.b64encode(pcm).decode()
        await self.send({"type": "input_audio_buffer.append", "audio": audio})
        self.clock += CHUNK_MS / 1000

    async def speak(self, fraction: float = 1.0) -> float:
        """Send the clip (or its first `fraction`) at real-time pace; returns when its end was sent."""
        end = int(len(self.cfg.speech) * fraction)
        for i in range(0, end, self.step):
            await self._chunk(self.cfg.speech[i : min(i + self.step, end)])
        return time.monotonic()

    async def silence_for(self, seconds: float) -> None:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            await self._chunk(bytes(self.step))

    async def silence_until(self, done: Any, what: str) -> None:
        deadline = time.monotonic() + self.cfg.turn_timeout_s
        while not done():
            if time.monotonic() > deadline:
                raise TurnTimeout(what)
            await self._chunk(bytes(self.step))

    def answer(self, n: int) -> _Answer | None:
        return self.answers[n] if len(self.answers) > n else None

    def streaming(self, n: int) -> bool:
        """The `n`-th answer of the session has sent audio."""
        a = self.answer(n)
        return a is not None and a.first_audio is not None

    def done(self, n: int) -> bool:
        a = self.answer(n)
        return a is not None and a.status is not None

    def record_latency(self, a: _Answer, speech_end: float) -> None:
        if a.first_audio is None:
            return
        stopped = next((s for s in self.stopped if s >= speech_end), None)
        response = a.first_audio - stopped if stopped is not None else None
        self.tally.latencies.append((a.first_audio - self.tally.t0, a.first_audio - speech_end, response))

    # ---- turns ---------------------------------------------------------------------------------
    async def normal_turn(self) -> None:
        n = len(self.answers)
        speech_end = await self.speak()
        await self.silence_until(lambda: self.done(n), "answer")
        a = self.answers[n]
        self.record_latency(a, speech_end)
        self._count_done(a)
        await self.silence_for(self.cfg.gap_s)

    async def barge_in_turn(self, rng: random.Random) -> None:
        n = len(self.answers)
        speech_end = await self.speak()
        await self.silence_until(lambda: self.streaming(n), "first audio")
        first = self.answers[n]
        self.record_latency(first, speech_end)
        await self.silence_for(rng.uniform(0, self.cfg.within_s))
        barge = time.monotonic()
        await self.speak()
        await self.silence_until(lambda: self.done(n) and self.done(n + 1), "answer after barge-in")
        if first.status == "cancelled" and first.reason == "turn_detected":
            self.tally.barge_ins += 1
            heard_ms = int(1000 * (barge - (first.first_audio or barge)))
            if first.item_id:
                await self.send(
                    {"type": "conversation.item.truncate", "item_id": first.item_id, "content_index": 0,
                     "audio_end_ms": heard_ms}
                )  # fmt: skip
        else:
            self.tally.barge_ins_late += 1
        self._count_done(self.answers[n + 1])
        await self.silence_for(self.cfg.gap_s)

    async def disconnect_turn(self, rng: random.Random) -> None:
        """Speak, then abort the TCP connection at a random point (no close frame)."""
        phase = rng.choices(DISCONNECT_PHASES, weights=self.cfg.phase_weights)[0]
        n = len(self.answers)
        if phase == "speaking":
            await self.speak(rng.uniform(0.1, 1.0))
        elif phase == "waiting":
            await self.speak()
            await self.silence_for(rng.uniform(0, self.cfg.silence_ms / 1000 + 0.3))
        else:
            speech_end = await self.speak()
            await self.silence_until(lambda: self.streaming(n), "first audio")
            self.record_latency(self.answers[n], speech_end)
            await self.silence_for(rng.uniform(0, self.cfg.within_s))
        a = self.answer(n)
        self.ws.transport.abort()
        self.tally.disconnects[phase] += 1
        if a is not None and a.status is None:
            self.tally.disconnects_mid_response += 1

    def _count_done(self, a: _Answer) -> None:
        if a.status in ("completed", "incomplete"):  # incomplete: ran to max_output_tokens
            self.tally.turns_completed += 1
        elif a.status != "failed":  # failed answers are counted as errors when they arrive
            self.tally.error(f"answer {a.status} ({a.reason})")


def _session_update(cfg: SoakConfig) -> dict[str, Any]:
    td = {"type": "server_vad", "silence_duration_ms": cfg.silence_ms}
    session: dict[str, Any] = {"type": "realtime", "audio": {"input": {"turn_detection": td}}}
    if cfg.max_output_tokens:
        session["max_output_tokens"] = cfg.max_output_tokens
    if cfg.audio_frames:
        extension = {"output_audio_frames": cfg.audio_frames, "min_output_tokens": cfg.max_output_tokens or 0}
        session["omnivoice"] = extension
    return {"type": "session.update", "session": session}


async def caller(cfg: SoakConfig, index: int, tally: SoakTally, stop: asyncio.Event) -> None:
    """One caller: sessions one after another until `stop` is set (checked between turns)."""
    rng = random.Random(cfg.seed * 1000 + index)
    while not stop.is_set():
        await one_session(cfg, tally, rng, stop)


async def one_session(cfg: SoakConfig, tally: SoakTally, rng: random.Random, stop: asyncio.Event) -> None:
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    try:
        ws = await websockets.connect(cfg.url, additional_headers=headers, max_size=None, open_timeout=30)
    except Exception as e:
        tally.error(f"connect: {type(e).__name__}")
        await asyncio.sleep(1.0)
        return
    tally.sessions_opened += 1
    tally.held += 1
    tally.peak_held = max(tally.peak_held, tally.held)
    session = _Session(ws, cfg, tally)
    reader = asyncio.create_task(session.read())
    aborted = False
    try:
        await session.send(_session_update(cfg))
        for _ in range(rng.randint(*cfg.turns)):
            if stop.is_set():
                break
            roll = rng.random()
            if roll < cfg.disconnect:
                await session.disconnect_turn(rng)
                aborted = True
                break
            if roll < cfg.disconnect + cfg.barge_in:
                await session.barge_in_turn(rng)
            else:
                await session.normal_turn()
    except TurnTimeout as e:
        tally.error(f"timeout: {e}")
    except websockets.ConnectionClosed as e:
        tally.error(f"closed by the server: {e.rcvd.code if e.rcvd else 'no close frame'}")
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        if not aborted:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ws.close(), timeout=5)
        tally.held -= 1
        tally.sessions_closed += 1
