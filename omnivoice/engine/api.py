"""The engine as the server sees it: the methods and attributes every transport may use.

`Engine` satisfies it, and so does the tests' fake engine; the server holds an `EngineAPI`, never the
concrete class, so it depends on this seam only (import-linter keeps `omnivoice.server` off the rest
of `omnivoice.engine` except its process figures).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import Protocol

import numpy as np

from omnivoice.audio.log_mel import LogMel
from omnivoice.types import (
    Capacity,
    ChatMessage,
    EngineOutput,
    EngineStats,
    FunctionSpec,
    GenerationRequest,
    Grammar,
    ModelInfo,
    Prompt,
    StageStats,
    Tools,
)

# What clients are told when a stage worker or the engine core dies: which process died, and how, is
# for the log only.
STOPPED = "the engine stopped unexpectedly"
RESTARTING = f"{STOPPED}; it is restarting, retry shortly"


class EngineAPI(Protocol):
    """A started engine: prompts in, text and audio out, and what operators read of it."""

    @property
    def info(self) -> ModelInfo:
        """The served model: name, sample rate, voices, prompt limits."""
        ...

    @property
    def failure(self) -> str | None:
        """Why the engine refuses work (a stage worker died, it is restarting), or None."""
        ...

    @property
    def restarting(self) -> bool:
        """Whether the stages are being restarted after a failure."""
        ...

    @property
    def narrowed(self) -> int | None:
        """The requests the engine serves at a time when its start found GPU memory for no wider batch
        (engine/warm_burst.py), else None."""
        ...

    @property
    def core_pid(self) -> int | None:
        """The engine core's process id where the core runs in a process of its own (`stages.core:
        process`; it changes when the core restarts), else None."""
        ...

    @property
    def log_mel(self) -> LogMel:
        """The served model's log-mel features: sessions featurize their audio with it, once per clip
        (off the event loop), and hand the features over with the audio (`AudioPart.features`)."""
        ...

    def build_prompt(self, messages: Sequence[ChatMessage], tools: Sequence[FunctionSpec] = ()) -> Prompt:
        """Token ids (and audio features) for a conversation offering the model `tools`; raises
        ValueError for bad input."""
        ...

    def check_grammar(self, grammar: Grammar) -> None:
        """Raise ValueError (a message for the client) if `grammar` cannot constrain the thinker: a JSON
        schema or grammar that does not compile. Special tokens it names are checked by the thinker."""
        ...

    def check_tools(self, tools: Tools) -> None:
        """Raise ValueError (a message for the client) if the call `tools` require cannot be enforced:
        a function's parameters schema that does not compile. `generate` holds the thinker to a
        call whenever a request's tools require one."""
        ...

    def overloaded(self, request: GenerationRequest) -> str | None:
        """Why `request` would be refused now (every stage at capacity), or None if it fits."""
        ...

    def generate(self, request: GenerationRequest) -> AsyncGenerator[EngineOutput, None]:
        """Run `request` through the stages, yielding its text deltas, audio chunks and `Finished`;
        closing the generator early (`aclose`) aborts the request in every stage."""
        ...

    async def abort(self, request_id: str) -> None:
        """Drop a running request in every stage."""
        ...

    async def warm(self, prompt: Prompt, cache_key: str) -> None:
        """Prefill `prompt` into the prefix cache under `cache_key` (a conversation's id)."""
        ...

    def encode_ahead(self, cache_key: str, features: Sequence[np.ndarray]) -> None:
        """Have the audio encoder encode whole windows ([n_mels, info.audio_window_frames] each) of speech
        still being spoken in conversation `cache_key`, so its turn's request encodes only the rest.
        Returns at once; a window the turn's audio does not have exactly is never used."""
        ...

    def forget(self, cache_key: str) -> None:
        """Free the prefix cached under `cache_key` (the conversation ended)."""
        ...

    def hold_restarts(self) -> None:
        """Restart no stage from now on (the server drains and shuts down)."""
        ...

    def stats(self) -> EngineStats:
        """Per-stage figures summed over replicas (for /metrics)."""
        ...

    def capacity(self) -> Capacity:
        """The audio streams the engine measures it can serve in real time, and how those in flight
        stand (what admission weighs a new stream against)."""
        ...

    def replica_stats(self) -> tuple[StageStats, ...]:
        """Each stage replica's own figures (for /v1/debug/state)."""
        ...

    async def close(self) -> None:
        """Stop every stage and release what they hold."""
        ...
