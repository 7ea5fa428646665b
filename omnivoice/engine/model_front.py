"""What the engine does with the served model alone, before any stage: prompts, grammars, the limits it
tells clients. The in-process engine and the engine client of a core process (engine/core/client.py)
both do it in the server's process, with the same tokenizer and prompt builder.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, Sequence
from pathlib import Path
from typing import Any

from omnivoice.audio.log_mel import LogMel
from omnivoice.config import Profile
from omnivoice.engine.grammar_vetting import GrammarVetter
from omnivoice.engine.loading import ServedModel, model_info
from omnivoice.models.tool_calls import call_grammar
from omnivoice.types import (
    STAGES,
    ChatMessage,
    EngineOutput,
    FunctionSpec,
    GenerationRequest,
    Grammar,
    ModelInfo,
    Prompt,
    Tools,
)


class ModelFront:
    """Prompt building and grammar checks for the served `model` (a base of the engine classes)."""

    def __init__(self, profile: Profile, model: ServedModel) -> None:
        self.profile = profile
        self.spec = model.spec
        self._builder = model.builder
        self._tokenizer = model.tokenizer
        self.info: ModelInfo = model_info(profile, model.spec, model.builder)
        t = profile.stages.thinker
        self._grammars = GrammarVetter(
            model.tokenizer if isinstance(model.source, Path) else None,
            tuple(model.spec.thinker_eos_ids),
            t.grammar_timeout_s,
            t.grammar_memory_mb,
            t.grammar_cache_entries,
        )

    def generate(self, request: GenerationRequest) -> AsyncGenerator[EngineOutput, None]:
        raise NotImplementedError

    def full_message(self, stage: int, narrowed: int | None = None) -> str:
        """What a request is told when stage `stage` (0 thinker, 1 talker, 2 code2wav) is full;
        `narrowed`: the requests the engine serves at once when its start narrowed it (`Engine.narrow`)."""
        name = STAGES[stage]
        cfg = self.profile.stages.stage(name)
        if narrowed is not None:
            requests = "1 request" if narrowed == 1 else f"{narrowed} requests"
            return f"the server is at capacity: its GPU memory allows {requests} at a time; retry shortly"
        return (
            f"the server is at capacity: the {name} stage holds {cfg.max_batch} running + "
            f"{cfg.max_queue} waiting requests (per replica); retry shortly"
        )

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer (a dummy model's is built from code: see models/dummy_tokenizer.py)."""
        return self._tokenizer

    @property
    def log_mel(self) -> LogMel:
        """The model's log-mel features (the prompt builder's)."""
        return self._builder.log_mel

    def build_prompt(self, messages: Sequence[ChatMessage], tools: Sequence[FunctionSpec] = ()) -> Prompt:
        return self._builder.build(
            messages, self.profile.model.system_prompt, tools, self.info.max_prompt_tokens
        )

    def check_grammar(self, grammar: Grammar) -> None:
        error = self._grammars.check(grammar)
        if error is not None:
            raise ValueError(error)

    def check_tools(self, tools: Tools) -> None:
        grammar = call_grammar(tools)
        error = self._grammars.check_functions(tools, grammar) if grammar is not None else None
        if error is not None:
            raise ValueError(error)

    async def warm(self, prompt: Prompt, cache_key: str) -> None:
        """Prefill `prompt` into `cache_key`'s prefix cache and return once it is there.

        A session calls this while the user is still speaking (with the conversation so far), so the
        turn's request later prefills only the new audio and what follows it.
        """
        req = GenerationRequest(
            f"warm-{uuid.uuid4().hex}", prompt, want_audio=False, cache_key=cache_key, prefill_only=True
        )
        async for _ in self.generate(req):
            pass
