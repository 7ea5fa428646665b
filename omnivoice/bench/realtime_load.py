"""Realtime load: N concurrent `/v1/realtime` sessions, each a caller speaking at real-time pace.

Every session streams its microphone continuously in 20 ms chunks on an absolute clock: the speech
clip, then silence until the response is done, then the next turn. The server's VAD ends each turn.
Per turn, on one monotonic clock:

- voice-to-voice: first `response.output_audio.delta` - the moment the last speech chunk was sent
  (includes the VAD's silence wait, as a caller experiences it);
- turn detection: `speech_stopped` arrival - end of speech; response: first audio - `speech_stopped`;
- stall: the longest wait of a player that starts at the first delta (bench.metrics.playback_stall).

The times are stamped when the client's event loop handles each event, so a client that cannot keep
up would add its own delay to them: each client process samples its event loop's lag while it runs
(`ClientLag`, every LAG_TICK_S), and the report says how late it was.

A session speaks only once the server has accepted its `session.update` (`session.updated`); one it
refuses (an `error`: nothing of the update applies) fails that session's turns instead of measuring
them with the server's defaults. The one exception: a server from before the
`session.omnivoice.speculative_response` extension refuses the key as unknown; it has no speculative
responses, so a session that asks for them off sends the update again without it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import multiprocessing
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Protocol

import websockets

from omnivoice.bench.metrics import playback_stall

RATE = 24000
CHUNK_MS = 20
LAG_TICK_S = 0.05  # the client's event loop is sampled this often
SPECULATIVE_PARAM = "session.omnivoice.speculative_response"


class SessionRejected(RuntimeError):
    """The server refused the session's `session.update`, or did not answer it."""


@dataclass(frozen=True)
class RealtimeLoadConfig:
    url: str  # ws://host:port/v1/realtime
    speech: bytes  # pcm16 24 kHz mono
    sessions: int = 1
    turns: int = 3
    silence_ms: int = 500  # server_vad silence_duration_ms
    gap_s: float = 0.5  # silence after a response ends before the next turn's speech
    max_output_tokens: int | None = None
    audio_frames: int | None = None  # omnivoice extension: fixed talker frames
    turn_timeout_s: float = 120.0
    api_key: str | None = None
    # session i connects i * ramp_s / sessions after the first: independent callers do not all start
    # speaking (and stop) in the same 20 ms, so their turns interleave as real arrivals do
    ramp_s: float = 0.0
    speculative: bool | None = None  # omnivoice extension: speculative responses (None: the server's)


@dataclass
class TurnRecord:
    session: int
    turn: int
    speech_end: float = 0.0
    stopped: float | None = None
    first_audio: float | None = None
    done: float | None = None
    chunks: list[tuple[float, float]] = field(default_factory=list)
    status: str | None = None
    error: str | None = None
    response_id: str | None = None  # the response whose audio came first (the server's log names it)
    # its response.done's usage: the prompt's tokens, and of them those the server had cached
    input_tokens: int | None = None
    cached_tokens: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.first_audio is not None


class ClientLag:
    """How late a client's event loop woke up, sampled every LAG_TICK_S while `sample` runs: each
    sample the seconds past its due time."""

    def __init__(self) -> None:
        self.samples: list[float] = []

    async def sample(self) -> None:
        due = time.monotonic() + LAG_TICK_S
        while True:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            now = time.monotonic()
            self.samples.append(max(0.0, now - due))
            due = max(due + LAG_TICK_S, now)


class _Caller:
    """One session: a sender streaming the microphone and a reader filling the current TurnRecord."""

    def __init__(self, cfg: RealtimeLoadConfig, index: int, on_turn: Callable[[TurnRecord], None]) -> None:
        self.cfg = cfg
        self.index = index
        self.on_turn = on_turn
        self.turn: TurnRecord | None = None
        self.turn_done = asyncio.Event()

    async def run(self) -> None:
        headers = {"Authorization": f"Bearer {self.cfg.api_key}"} if self.cfg.api_key else {}
        async with websockets.connect(self.cfg.url, additional_headers=headers, max_size=None) as ws:
            await self._configure(ws)
            reader = asyncio.create_task(self._read(ws))
            try:
                await self._speak(ws)
            finally:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)

    async def _configure(self, ws: Any) -> None:
        """Send the session's settings and wait until the server has applied them (see the module's
        docstring); raises SessionRejected if it refuses them."""
        session = self._session()
        while True:
            await ws.send(json.dumps({"type": "session.update", "session": session}))
            refused = await _update_outcome(ws, self.cfg.turn_timeout_s)
            if refused is None:
                return
            if _speculation_unknown(refused) and self.cfg.speculative is False:
                extension = {k: v for k, v in session["omnivoice"].items() if k != "speculative_response"}
                session = {k: v for k, v in session.items() if k != "omnivoice"}
                if extension:
                    session["omnivoice"] = extension
                print(
                    f"[session {self.index}] the server does not know {SPECULATIVE_PARAM}: it has no "
                    "speculative responses, so they are off; updating without it",
                    file=sys.stderr,
                    flush=True,
                )
                continue
            raise SessionRejected(f"session.update refused: {refused.get('message', refused)}")

    def _session(self) -> dict[str, Any]:
        td = {"type": "server_vad", "silence_duration_ms": self.cfg.silence_ms}
        session: dict[str, Any] = {"type": "realtime", "audio": {"input": {"turn_detection": td}}}
        if self.cfg.max_output_tokens:
            session["max_output_tokens"] = self.cfg.max_output_tokens
        extension: dict[str, Any] = {}
        if self.cfg.audio_frames:
            tokens = self.cfg.max_output_tokens or 0
            extension = {"output_audio_frames": self.cfg.audio_frames, "min_output_tokens": tokens}
        if self.cfg.speculative is not None:
            extension["speculative_response"] = self.cfg.speculative
        if extension:
            session["omnivoice"] = extension
        return session

    async def _speak(self, ws: Any) -> None:
        step = RATE * 2 * CHUNK_MS // 1000
        clock = time.monotonic()
        for n in range(self.cfg.turns):
            self.turn = TurnRecord(self.index, n)
            self.turn_done.clear()
            for i in range(0, len(self.cfg.speech), step):
                clock = await _send_at(ws, self.cfg.speech[i : i + step], clock)
            self.turn.speech_end = time.monotonic()
            silence = bytes(step)
            deadline = time.monotonic() + self.cfg.turn_timeout_s
            while not self.turn_done.is_set():
                if time.monotonic() > deadline:
                    self.turn.error = "timeout"
                    break
                clock = await _send_at(ws, silence, clock)
            gap_end = time.monotonic() + self.cfg.gap_s
            while time.monotonic() < gap_end:
                clock = await _send_at(ws, silence, clock)
            self.on_turn(self.turn)

    async def _read(self, ws: Any) -> None:
        async for message in ws:
            event = json.loads(message)
            now, turn, kind = time.monotonic(), self.turn, event.get("type")
            if turn is None:
                continue
            if kind == "input_audio_buffer.speech_stopped" and turn.stopped is None:
                turn.stopped = now
            elif kind == "response.output_audio.delta":
                if turn.first_audio is None:
                    turn.first_audio, turn.response_id = now, event.get("response_id")
                turn.chunks.append((now, len(base64.b64decode(event["delta"])) / (2 * RATE)))
            elif kind == "response.done" and turn.stopped is not None:
                turn.done, turn.status = now, event["response"]["status"]
                usage = event["response"].get("usage") or {}
                turn.input_tokens = usage.get("input_tokens")
                turn.cached_tokens = (usage.get("input_token_details") or {}).get("cached_tokens")
                self.turn_done.set()
            elif kind == "error":
                turn.error = event["error"].get("message", "error")
                self.turn_done.set()


async def _update_outcome(ws: Any, timeout_s: float) -> dict[str, Any] | None:
    """Read events up to the answer to a `session.update`: None for `session.updated`, the `error`
    object if refused. Raises SessionRejected if neither comes within `timeout_s`."""
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                event = json.loads(await ws.recv())
                if event.get("type") == "session.updated":
                    return None
                if event.get("type") == "error":
                    refused: dict[str, Any] = event.get("error") or {}
                    return refused
    except TimeoutError:
        raise SessionRejected(f"no answer to session.update within {timeout_s:.0f} s") from None


def _speculation_unknown(refused: dict[str, Any]) -> bool:
    return refused.get("code") == "unknown_parameter" and refused.get("param") == SPECULATIVE_PARAM


async def _send_at(ws: Any, chunk: bytes, clock: float) -> float:
    """Send one chunk at `clock` (absolute schedule: no drift); returns the next chunk's time."""
    delay = clock - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
    await ws.send(
        json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(chunk).decode()})
    )
    return clock + CHUNK_MS / 1000


class Caller(Protocol):
    async def run(self) -> None: ...


CallerFactory = Callable[[RealtimeLoadConfig, int, Callable[[TurnRecord], None]], Caller]


async def run_realtime_load(
    cfg: RealtimeLoadConfig,
    on_turn: Callable[[TurnRecord], None],
    caller: CallerFactory | None = None,
    indices: Sequence[int] | None = None,
    start_at: float | None = None,
    lag: ClientLag | None = None,
) -> tuple[list[TurnRecord], float]:
    """Run every session to its last turn; returns the turn records and the wall time taken.
    `caller` makes one session's client (default: a `/v1/realtime` client; see bench.twilio_load).
    `indices` runs only those sessions of the `cfg.sessions` (a shard: see `run_in_processes`), each
    started at its place of the ramp counted from `start_at` (a `time.monotonic()` instant, which
    every process of the machine shares; default now). `lag`: sampled while the sessions run."""
    make = caller or _Caller
    chosen = list(range(cfg.sessions) if indices is None else indices)
    records: list[TurnRecord] = []

    def record(turn: TurnRecord) -> None:
        records.append(turn)
        on_turn(turn)

    t0 = time.monotonic() if start_at is None else start_at

    async def start(i: int) -> None:
        await asyncio.sleep(max(0.0, t0 + i * cfg.ramp_s / cfg.sessions - time.monotonic()))
        await make(cfg, i, record).run()

    sampler = asyncio.create_task(lag.sample()) if lag is not None else None
    try:
        results = await asyncio.gather(*(start(i) for i in chosen), return_exceptions=True)
    finally:
        if sampler is not None:
            sampler.cancel()
            await asyncio.gather(sampler, return_exceptions=True)
    for i, r in zip(chosen, results, strict=True):
        if isinstance(r, BaseException):
            records.append(TurnRecord(i, -1, error=f"{type(r).__name__}: {r}"))
    return records, time.monotonic() - t0


def print_turn(r: TurnRecord) -> None:
    """One line on stderr per finished turn: its voice-to-voice latency, audio and stall."""
    if not r.ok:
        print(f"[session {r.session} turn {r.turn}] error: {r.error}", file=sys.stderr, flush=True)
        return
    v2v = 1000 * (r.first_audio - r.speech_end) if r.first_audio else float("nan")
    audio = sum(s for _, s in r.chunks)
    print(
        f"[session {r.session} turn {r.turn}] v2v {v2v:.0f} ms, audio {audio:.2f} s, "
        f"stall {1000 * playback_stall(r.chunks):.0f} ms, {r.status}",
        file=sys.stderr,
        flush=True,
    )


def _quiet(r: TurnRecord) -> None:
    pass


def _shard(
    conn: Connection, cfg: RealtimeLoadConfig, indices: list[int], caller: CallerFactory | None, quiet: bool
) -> None:
    """A client process: says it is ready, waits for the common start instant, runs its sessions and
    sends back their records."""
    conn.send("ready")
    start_at = conn.recv()
    lag = ClientLag()
    records, _ = asyncio.run(
        run_realtime_load(cfg, _quiet if quiet else print_turn, caller, indices, start_at, lag)
    )
    conn.send((records, time.monotonic(), lag.samples))
    conn.close()


def run_in_processes(
    cfg: RealtimeLoadConfig,
    processes: int,
    caller: CallerFactory | None = None,
    quiet: bool = False,
    lag: ClientLag | None = None,
) -> tuple[list[TurnRecord], float]:
    """`run_realtime_load` with the sessions dealt round-robin over `processes` client processes, so
    a hundred callers' JSON, base64 and WebSocket work does not queue on one client interpreter (which
    would add its own delay to every measured latency). Every process is started and ready before the
    common ramp begins; a process that dies fails its sessions' turns. `lag` gets every client
    process's samples of its event loop's lag."""
    if processes <= 1:
        return asyncio.run(run_realtime_load(cfg, _quiet if quiet else print_turn, caller, lag=lag))
    ctx = multiprocessing.get_context("spawn")
    shards = [list(range(cfg.sessions))[k::processes] for k in range(processes)]
    shards = [s for s in shards if s]
    started: list[tuple[Any, Connection, list[int]]] = []
    for indices in shards:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_shard, args=(child, cfg, indices, caller, quiet), daemon=True)
        proc.start()
        child.close()
        started.append((proc, parent, indices))
    records: list[TurnRecord] = []
    ready: list[tuple[Any, Connection, list[int]]] = []
    for proc, conn, indices in started:
        try:
            conn.recv()  # ready: imported and waiting
            ready.append((proc, conn, indices))
        except (EOFError, OSError) as e:  # it died while starting
            records.extend(_failed(indices, e))
            proc.join(timeout=10)
    start_at = time.monotonic() + 0.2
    for _, conn, _ in ready:
        conn.send(start_at)
    end = start_at
    for proc, conn, indices in ready:
        try:
            shard_records, shard_end, shard_lag = conn.recv()
            records.extend(shard_records)
            end = max(end, shard_end)
            if lag is not None:
                lag.samples.extend(shard_lag)
        except (EOFError, OSError) as e:
            records.extend(_failed(indices, e))
        proc.join(timeout=10)
    return records, end - start_at


def _failed(indices: list[int], e: BaseException) -> list[TurnRecord]:
    return [TurnRecord(i, -1, error=f"client process failed: {e!r}") for i in indices]
