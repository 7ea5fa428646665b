"""A response's engine request: what the response should produce (`ResponsePlan`), the request that
prompts the engine with the conversation and starts it (`start_generation`), and a request started
before its response exists (`EarlyStart`: the speculative start of speculation.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from omnivoice.audio.formats import AudioFormat
from omnivoice.engine.api import EngineAPI
from omnivoice.server.session.conversation import Conversation
from omnivoice.server.session.prompting import build_prompt
from omnivoice.server.session.read_ahead import ReadAhead
from omnivoice.server.session.tools import SessionTools
from omnivoice.types import ChatMessage, EngineOverloaded, GenerationRequest, Sampling


@dataclass(frozen=True)
class ResponsePlan:
    """What one response should produce, resolved from the session settings and `response.create`."""

    voice: str
    output_format: AudioFormat
    want_audio: bool
    instructions: str | None
    thinker: Sampling
    talker: Sampling
    in_conversation: bool = True
    metadata: dict[str, str] | None = None
    tools: SessionTools = field(default_factory=SessionTools)


@dataclass(frozen=True)
class Started:
    """A response's engine request under way: the history it was prompted with, its outputs read ahead."""

    request: GenerationRequest
    messages: list[ChatMessage]
    ahead: ReadAhead


class EarlyStart(Protocol):
    """An engine request started for a response before the response itself (a speculative start)."""

    response_id: str

    async def take(self) -> Started | None:
        """The request under way, now the response's; None if it could not start (the response then
        starts its own)."""
        ...

    async def close(self) -> None:
        """Abort the request in every stage unless it was taken."""
        ...


async def start_generation(
    engine: EngineAPI, response_id: str, session_id: str, plan: ResponsePlan, conversation: Conversation
) -> Started | str:
    """Prompt the engine with `conversation` for `plan`; a user-facing reason if no prompt could be
    built, EngineOverloaded if a stage is full (before anything was sent to the engine)."""
    tools = plan.tools.for_engine()
    functions = tools.functions if tools is not None else ()
    built = await build_prompt(engine, conversation, plan.instructions, functions)
    if isinstance(built, str):
        return built
    prompt, messages = built
    request = GenerationRequest(
        response_id,
        prompt,
        want_audio=plan.want_audio,
        voice=plan.voice,
        thinker=plan.thinker,
        talker=plan.talker,
        cache_key=session_id if plan.in_conversation else None,  # KV kept between turns
        tools=tools,
    )
    why = engine.overloaded(request)
    if why is not None:
        raise EngineOverloaded(why)
    return Started(request, messages, ReadAhead(engine.generate(request)))
