"""A stand-in for the engine (`omnivoice.engine.api.EngineAPI`, checked by mypy below), for tests of
the server only.

It yields a scripted interleaving of TextDeltas and AudioChunks with sleeps in between, records
every request and every abort (explicit, or by the consumer leaving the iterator early), and can
be told to start slowly, fail to start, or fail mid-generation.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from starlette.applications import Starlette
from transformers import WhisperFeatureExtractor

from omnivoice.audio.log_mel import LogMel
from omnivoice.config import Profile, parse_profile
from omnivoice.engine.api import EngineAPI
from omnivoice.engine.start_progress import StartProgress
from omnivoice.messages import StartStep
from omnivoice.models.grammars import grammar_error
from omnivoice.models.tool_calls import call_grammar
from omnivoice.server import create_app
from omnivoice.types import (
    AudioChunk,
    AudioPart,
    Capacity,
    ChatMessage,
    EngineOutput,
    EngineOverloaded,
    EngineStats,
    EngineUnavailable,
    Finished,
    FunctionSpec,
    GenerationRequest,
    Grammar,
    ModelInfo,
    Prompt,
    StageStats,
    TextDelta,
    TextPart,
    ToolCall,
    ToolCallDelta,
    ToolCallDone,
    Tools,
    Usage,
)

from .serve import serve

SAMPLE_RATE = 24000
VOICES = ("ethan", "chelsie")


class FakePromptError(ValueError):
    pass


def fake_model_info(served_name: str = "omnivoice", audio_window_frames: int = 0) -> ModelInfo:
    """The fake model: 24 kHz, two voices, a 200-token context, no bound on characters before
    `build_prompt` (`max_prompt_chars` None), no audio encoded ahead unless `audio_window_frames`."""
    return ModelInfo(
        served_name,
        SAMPLE_RATE,
        VOICES,
        default_voice="ethan",
        max_prompt_tokens=200,
        audio_window_frames=audio_window_frames,
    )


def fake_log_mel() -> LogMel:
    """Qwen3-Omni's log-mel settings (128 mel bins at 16 kHz), a real extractor that counts its frames."""
    extractor = WhisperFeatureExtractor(feature_size=128, sampling_rate=16000, hop_length=160, n_fft=400)
    return LogMel.of(extractor)


@dataclass
class Script:
    """What each request produces: `texts[i]` is followed by audio chunk i while audio lasts."""

    texts: tuple[str, ...] = ("Hello", " there", ",", " friend", "!")
    audio_chunks: int = 3
    chunk_samples: int = 2400  # 0.1 s at 24 kHz
    delay: float = 0.01  # seconds between outputs
    finish_reason: Literal["stop", "length", "abort", "error"] = "stop"
    raise_after: int | None = None  # raise RuntimeError after this many outputs
    # (name, arguments) of the calls made after the text, by requests that offer functions
    tool_calls: tuple[tuple[str, str], ...] = ()
    cached_tokens: int = 0  # of each prompt, the tokens its usage reports as cached (at most all)


class AlwaysAdmit:
    """Stands in for the app's admission control where a test drives a session directly: always admits."""

    class _Slot:
        def release(self) -> None:
            pass

    def acquire(self) -> _Slot:
        return self._Slot()

    def promise_stream(self) -> _Slot:
        return self._Slot()


@dataclass
class FakeEngine:
    info: ModelInfo
    script: Script = field(default_factory=Script)
    requests: list[GenerationRequest] = field(default_factory=list)
    prompts: list[tuple[ChatMessage, ...]] = field(default_factory=list)
    tools: list[tuple[FunctionSpec, ...]] = field(default_factory=list)  # offered with each prompt
    aborted: list[str] = field(default_factory=list)
    running: set[str] = field(default_factory=set)
    warmed: list[str] = field(default_factory=list)
    # (cache key, windows) sent to be encoded ahead
    ahead: list[tuple[str, tuple[np.ndarray, ...]]] = field(default_factory=list)
    log_mel: LogMel = field(default_factory=fake_log_mel)
    forgotten: list[str] = field(default_factory=list)
    closed: bool = False
    failure: str | None = None  # as Engine.failure: set when a stage worker died
    restarting: bool = False  # as Engine.restarting
    restarts_held: bool = False  # hold_restarts() was called (the server drains)
    core_pid: int | None = None  # as EngineAPI.core_pid: the core runs in this process
    max_running: int | None = None  # requests running at once; more are refused (as Engine.overloaded)
    # what capacity() reports: the real-time streams measured (None: not yet), an admitted one stalled
    streams: int | None = None
    stalled: bool = False
    graphs_pending: int = 0  # the talker's CUDA graphs left for after the start, as a worker reports them
    narrowed: int | None = None  # the requests served at once when the start narrowed the engine

    @classmethod
    def factory(
        cls,
        script: Script | None = None,
        *,
        engines: list[FakeEngine] | None = None,
        start_gate: threading.Event | None = None,
        fail_start: bool = False,
        audio_window_frames: int = 0,
    ) -> Callable[[Profile, StartProgress], Awaitable[FakeEngine]]:
        """An `engine_factory` for `create_app`; started engines are appended to `engines`.
        `audio_window_frames`: as `ModelInfo`'s (0: sessions encode nothing ahead). While it waits for
        `start_gate`, its start reports one step running ("fake#0 gate")."""

        async def start(profile: Profile, progress: StartProgress) -> FakeEngine:
            if start_gate is not None:
                progress.record(StartStep("fake", 0, "gate"))
                while not start_gate.is_set():
                    await asyncio.sleep(0.01)
            if fail_start:
                raise RuntimeError("weights not found")
            info = fake_model_info(profile.model.served_name, audio_window_frames)
            engine = cls(info, script or Script())
            if engines is not None:
                engines.append(engine)
            return engine

        return start

    def build_prompt(self, messages: Sequence[ChatMessage], tools: Sequence[FunctionSpec] = ()) -> Prompt:
        self.prompts.append(tuple(messages))
        self.tools.append(tuple(tools))
        n = 0
        for m in messages:
            for p in m.parts:
                if isinstance(p, TextPart):
                    if "FORBIDDEN" in p.text:
                        raise FakePromptError("the prompt contains a forbidden word")
                    n += len(p.text.split())
                elif isinstance(p, AudioPart):
                    n += max(1, int(p.pcm.size / p.sample_rate * 25))
        return Prompt(input_ids=tuple(range(n)))

    def check_grammar(self, grammar: Grammar) -> None:
        error = grammar_error(grammar)  # the real engine's check: it needs no model
        if error is not None:
            raise ValueError(error)

    def check_tools(self, tools: Tools) -> None:
        grammar = call_grammar(tools)  # the real engine's check, likewise
        if grammar is not None:
            self.check_grammar(grammar)

    def overloaded(self, request: GenerationRequest) -> str | None:
        if self.max_running is not None and len(self.running) >= self.max_running:
            return f"the fake engine runs {self.max_running} requests at most"
        return None

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[EngineOutput, None]:
        if self.failure:
            raise EngineUnavailable(self.failure)
        why = self.overloaded(request)
        if why is not None:
            raise EngineOverloaded(why)
        rid, s = request.request_id, self.script
        self.requests.append(request)
        self.running.add(rid)
        finished = False
        try:
            for i, out in enumerate(self._outputs(request)):
                await asyncio.sleep(s.delay)
                if s.raise_after is not None and i >= s.raise_after:
                    raise RuntimeError("talker exploded")
                finished = isinstance(out, Finished)
                yield out
        finally:
            self.running.discard(rid)
            if not finished:
                self.aborted.append(rid)

    def _outputs(self, request: GenerationRequest) -> list[EngineOutput]:
        s, rid = self.script, request.request_id
        n_audio = s.audio_chunks if request.want_audio else 0
        outs: list[EngineOutput] = []
        for i in range(max(len(s.texts), n_audio)):
            if i < len(s.texts):
                outs.append(TextDelta(rid, (i,), s.texts[i]))
            if i < n_audio:
                pcm = np.full(s.chunk_samples, 0.25 if i % 2 else -0.25, np.float32)
                outs.append(AudioChunk(rid, i, pcm, SAMPLE_RATE))
        if request.tools is not None:
            outs += self._calls(rid)
        prompt = len(request.prompt.input_ids)
        usage = Usage(
            prompt, len(s.texts), audio_frames=n_audio * 2, cached_tokens=min(s.cached_tokens, prompt)
        )
        outs.append(
            Finished(rid, s.finish_reason, usage, error="boom" if s.finish_reason == "error" else None)
        )  # type: ignore[arg-type]
        return outs

    def _calls(self, rid: str) -> list[EngineOutput]:
        """Each scripted call as the engine streams one: its name, its arguments in two pieces, done."""
        outs: list[EngineOutput] = []
        for i, (name, arguments) in enumerate(self.script.tool_calls):
            call_id, half = f"call_{rid[-6:]}_{i}", len(arguments) // 2
            outs.append(ToolCallDelta(rid, i, call_id, name, ""))
            outs += [ToolCallDelta(rid, i, call_id, None, a) for a in (arguments[:half], arguments[half:])]
            outs.append(ToolCallDone(rid, i, ToolCall(call_id, name, arguments)))
        return outs

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def warm(self, prompt: Prompt, cache_key: str) -> None:
        self.warmed.append(cache_key)

    def encode_ahead(self, cache_key: str, features: Sequence[np.ndarray]) -> None:
        self.ahead.append((cache_key, tuple(features)))

    def forget(self, cache_key: str) -> None:
        self.forgotten.append(cache_key)

    def stats(self) -> EngineStats:
        running = len(self.running)
        stages = tuple(
            StageStats(
                name, 0, running, running, 7, graphs_pending=self.graphs_pending if name == "talker" else 0
            )
            for name in ("thinker", "talker", "code2wav")
        )
        return EngineStats(
            stages=stages, active_requests=running, capacity=self.capacity(), narrowed=self.narrowed
        )

    def capacity(self) -> Capacity:
        return Capacity(self.streams, len(self.running), -1.0 if self.stalled else None, self.stalled)

    def replica_stats(self) -> tuple[StageStats, ...]:
        return self.stats().stages

    def hold_restarts(self) -> None:
        self.restarts_held = True

    async def close(self) -> None:
        self.closed = True


def _is_engine(engine: FakeEngine) -> EngineAPI:
    return engine  # mypy checks here that the fake has every method and attribute of the engine seam


@dataclass
class FakeServer:
    url: str
    app: Starlette
    engines: list[FakeEngine]

    @property
    def engine(self) -> FakeEngine:
        return self.engines[0]

    def count(self, status: str) -> float | None:
        """Current value of omnivoice_requests_total{status=...}."""
        return self.app.state.metrics.registry.get_sample_value(
            "omnivoice_requests_total", {"status": status}
        )


@contextmanager
def serve_fake(
    script: Script | None = None,
    *,
    server: dict[str, object] | None = None,
    wait_healthy: float | None = 30.0,
    start_gate: threading.Event | None = None,
    fail_start: bool = False,
) -> Iterator[FakeServer]:
    """A real uvicorn server over a FakeEngine; `server` overrides keys of the profile's `server` section;
    `start_gate` and `fail_start` as `FakeEngine.factory`'s."""
    profile = parse_profile({"server": server or {}})
    engines: list[FakeEngine] = []
    factory = FakeEngine.factory(script, engines=engines, start_gate=start_gate, fail_start=fail_start)
    app = create_app(profile, factory)
    with serve(app, wait_healthy=wait_healthy) as url:
        yield FakeServer(url, app, engines)


@contextmanager
def serve_realtime(
    script: Script | None = None, *, audio_window_frames: int = 0, **realtime: Any
) -> Iterator[FakeServer]:
    """As `serve_fake`, with `realtime` overriding keys of the profile's `realtime` section;
    `audio_window_frames` as `FakeEngine.factory`'s."""
    profile = parse_profile({"realtime": realtime})
    engines: list[FakeEngine] = []
    factory = FakeEngine.factory(script, engines=engines, audio_window_frames=audio_window_frames)
    app = create_app(profile, factory)
    with serve(app) as url:
        yield FakeServer(url, app, engines)
