"""Closed-loop load on `/v1/chat/completions` with streamed text and audio.

`concurrency` workers each send one request, read its SSE stream to the end, and send the next,
until `num_prompts` requests are done; `warmups` requests go first and are not measured. Works
against any server of this protocol (omnivoice, vLLM-Omni): every SSE chunk may carry a `modality`
("text" | "audio"); audio comes base64 in `choices[0].delta.audio.data` (OpenAI style) or
`choices[0].delta.content` (vLLM-Omni style), raw pcm16 mono 24 kHz or a WAV per chunk.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import struct
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from omnivoice.bench.metrics import RequestRecord
from omnivoice.bench.server_metrics import Samples, scrape

PCM_RATE = 24000  # pcm16 in this protocol is 16-bit mono little-endian at 24 kHz


@dataclass(frozen=True)
class LoadConfig:
    base_url: str
    prompts: tuple[str, ...]
    model: str | None = None
    num_prompts: int = 16
    concurrency: int = 1
    warmups: int = 0
    max_tokens: int = 256
    modalities: tuple[str, ...] = ("text", "audio")
    voice: str = "ethan"
    audio_format: str = "pcm16"
    include_usage: bool = True
    api_key: str | None = None
    seed: int | None = None
    temperature: float | None = None
    timeout_s: float = 600.0
    extra_body: Mapping[str, Any] = field(default_factory=dict)  # merged into every request body
    input_audio: bytes | None = None  # a WAV sent as an input_audio part before the prompt's text


@dataclass
class LoadResult:
    records: list[RequestRecord]  # measured requests only, in send order
    duration_s: float  # wall time of the measured phase
    model: str
    owned_by: str | None
    # the server's /metrics right before and after the measured phase (None: not readable there)
    scraped: tuple[Samples | None, Samples | None] = (None, None)


Progress = Callable[[str, int, int, RequestRecord], None]  # (phase, done, total, record)


def audio_seconds(data: bytes) -> float:
    """Seconds of audio in one decoded chunk: a WAV if it starts with RIFF, else raw pcm16 24 kHz."""
    if data[:4] == b"RIFF":
        return wav_seconds(data)
    return len(data) / 2 / PCM_RATE


def wav_seconds(data: bytes) -> float:
    """Duration of a (possibly streamed) WAV; a data size of 0 or 0xFFFFFFFF means 'to the end'."""
    if len(data) < 12 or data[8:12] != b"WAVE":
        raise ValueError("RIFF payload is not a WAVE file")
    pos, block_align, rate = 12, 0, 0
    while pos + 8 <= len(data):
        chunk_id = data[pos : pos + 4]
        (size,) = struct.unpack_from("<I", data, pos + 4)
        body = pos + 8
        if chunk_id == b"fmt ":
            (rate,) = struct.unpack_from("<I", data, body + 4)
            (block_align,) = struct.unpack_from("<H", data, body + 12)
        elif chunk_id == b"data":
            if not block_align or not rate:
                raise ValueError("WAV data chunk before a valid fmt chunk")
            available = len(data) - body
            n = available if size in (0, 0xFFFFFFFF) or size > available else size
            return n // block_align / rate
        pos = body + size + (size & 1)
    raise ValueError("WAV without a data chunk")


def build_payload(cfg: LoadConfig, model: str, prompt: str) -> dict:
    payload: dict = {
        "model": model,
        "messages": [{"role": "user", "content": _content(cfg, prompt)}],
        "stream": True,
        "max_tokens": cfg.max_tokens,
        "modalities": list(cfg.modalities),
    }
    if "audio" in cfg.modalities:
        payload["audio"] = {"voice": cfg.voice, "format": cfg.audio_format}
    if cfg.include_usage:
        payload["stream_options"] = {"include_usage": True}
    if cfg.seed is not None:
        payload["seed"] = cfg.seed
    if cfg.temperature is not None:
        payload["temperature"] = cfg.temperature
    payload.update(cfg.extra_body)
    return payload


def _content(cfg: LoadConfig, prompt: str) -> str | list[dict[str, Any]]:
    if cfg.input_audio is None:
        return prompt
    clip = {"data": base64.b64encode(cfg.input_audio).decode(), "format": "wav"}
    return [{"type": "input_audio", "input_audio": clip}, {"type": "text", "text": prompt}]


async def sse_events(response: httpx.Response) -> AsyncIterator[str]:
    """The `data` of each server-sent event (multi-line data joined with newlines)."""
    data: list[str] = []
    async for line in response.aiter_lines():
        if line:
            if line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
            continue
        if data:
            yield "\n".join(data)
            data = []
    if data:
        yield "\n".join(data)


class _StreamState:
    """Reads one response's chunks into a record."""

    def __init__(self, record: RequestRecord) -> None:
        self.record = record
        self.text_chunks = 0
        self.usage_tokens: int | None = None
        self.prompt_tokens: int | None = None

    def feed(self, chunk: dict, now: float) -> None:
        if chunk.get("error"):
            raise RuntimeError(f"server error in stream: {json.dumps(chunk['error'])[:300]}")
        usage = chunk.get("usage")
        if isinstance(usage, dict):  # each count as the server gives it, whichever chunk has it
            if usage.get("completion_tokens") is not None:
                self.usage_tokens = int(usage["completion_tokens"])
            if usage.get("prompt_tokens") is not None:
                self.prompt_tokens = int(usage["prompt_tokens"])
        choices = chunk.get("choices") or []
        if not choices:
            return
        delta = choices[0].get("delta") or {}
        audio = delta.get("audio")
        if not isinstance(audio, dict):
            audio = {}
        modality = chunk.get("modality") or ("audio" if audio.get("data") else "text")
        if modality == "audio":
            b64 = audio.get("data") or delta.get("content")
            if b64:
                seconds = audio_seconds(base64.b64decode(b64))
                if seconds > 0:
                    self.record.audio_chunks.append((now, seconds))
        elif modality == "text" and delta.get("content"):
            if self.record.first_text is None:
                self.record.first_text = now
            self.text_chunks += 1

    def finish(self, now: float) -> RequestRecord:
        self.record.end = now
        self.record.text_tokens = self.usage_tokens if self.usage_tokens is not None else self.text_chunks
        self.record.prompt_tokens = self.prompt_tokens
        return self.record


async def send_one(client: httpx.AsyncClient, cfg: LoadConfig, model: str, prompt: str) -> RequestRecord:
    """Send one streamed request and time its chunks; failures end up in `record.error`, never raised."""
    payload = build_payload(cfg, model, prompt)
    record = RequestRecord(t0=time.perf_counter())
    state = _StreamState(record)
    try:
        async with client.stream("POST", "/v1/chat/completions", json=payload) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode("utf-8", "replace")
                raise RuntimeError(f"HTTP {response.status_code}: {body[:300]}")
            async for data in sse_events(response):
                if data.strip() == "[DONE]":
                    break
                state.feed(json.loads(data), time.perf_counter())
    except Exception as e:  # a request boundary: every failure is counted, none ends the run
        record.error = f"{type(e).__name__}: {e}"
    state.finish(time.perf_counter())
    return record


async def fetch_models(client: httpx.AsyncClient) -> list[dict]:
    response = await client.get("/v1/models")
    response.raise_for_status()
    return list(response.json().get("data") or [])


async def _phase(
    client: httpx.AsyncClient,
    cfg: LoadConfig,
    model: str,
    prompts: list[str],
    phase: str,
    progress: Progress | None,
) -> list[RequestRecord]:
    records: list[RequestRecord | None] = [None] * len(prompts)
    todo = iter(range(len(prompts)))  # shared by the workers: each takes the next index when free
    done = 0

    async def worker() -> None:
        nonlocal done
        for i in todo:
            record = await send_one(client, cfg, model, prompts[i])
            records[i] = record
            done += 1
            if progress is not None:
                progress(phase, done, len(prompts), record)

    async with asyncio.TaskGroup() as tg:
        for _ in range(min(cfg.concurrency, len(prompts))):
            tg.create_task(worker())
    return [r for r in records if r is not None]


def prompt_sequence(cfg: LoadConfig) -> list[str]:
    """Prompts for warm-ups then measured requests, cycling; shuffled per cycle when seeded."""
    n = cfg.warmups + cfg.num_prompts
    rng = random.Random(cfg.seed) if cfg.seed is not None else None
    out: list[str] = []
    while len(out) < n:
        cycle = list(cfg.prompts)
        if rng is not None:
            rng.shuffle(cycle)
        out.extend(cycle)
    return out[:n]


async def run_load(cfg: LoadConfig, progress: Progress | None = None) -> LoadResult:
    """Run warm-ups, then the measured closed loop. Raises httpx.HTTPError if the model can't be found."""
    if not cfg.prompts:
        raise ValueError("no prompts")
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    limits = httpx.Limits(max_connections=cfg.concurrency, max_keepalive_connections=cfg.concurrency)
    timeout = httpx.Timeout(cfg.timeout_s, connect=10.0)
    # trust_env=False: a benchmark must not go through an HTTP proxy picked up from the environment.
    async with httpx.AsyncClient(
        base_url=cfg.base_url, headers=headers, limits=limits, timeout=timeout, trust_env=False
    ) as client:
        try:
            models = await fetch_models(client)
        except (httpx.HTTPError, ValueError):
            if cfg.model is None:
                raise
            models = []
        entry = next((m for m in models if cfg.model in (None, m.get("id"))), None)
        model = cfg.model or (entry or {}).get("id")
        if not model:
            raise ValueError("the server lists no model; pass --model")
        owned_by = (entry or {}).get("owned_by")
        prompts = prompt_sequence(cfg)
        await _phase(client, cfg, model, prompts[: cfg.warmups], "warm-up", progress)
        before = await asyncio.to_thread(scrape, cfg.base_url, cfg.api_key)
        start = time.perf_counter()
        records = await _phase(client, cfg, model, prompts[cfg.warmups :], "request", progress)
        duration = time.perf_counter() - start
        after = await asyncio.to_thread(scrape, cfg.base_url, cfg.api_key)
        return LoadResult(records, duration, model, owned_by, (before, after))
