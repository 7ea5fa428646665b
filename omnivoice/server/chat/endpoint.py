"""`POST /v1/chat/completions`: admission, validation, then the engine's outputs as JSON or SSE
(`chat.respond`).

The response shapes (OpenAI SDK + vLLM-Omni compatible) are documented in `chat.format`.
A request ends in exactly one `omnivoice_requests_total{status}`: ok, cancelled (client left or
stopped reading, or the server shut down; the engine request is aborted), error, invalid (4xx),
rejected (over a limit: 429, or 503 server_overloaded) or unavailable (503: loading, failed,
shutting down).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from omnivoice.config import Profile
from omnivoice.engine.api import EngineAPI
from omnivoice.server.chat.format import Turn
from omnivoice.server.chat.respond import complete, stream
from omnivoice.server.chat.schema import (
    ChatRequest,
    check_room,
    check_voice,
    context_length_exceeded,
    parse_chat_request,
    prompt_texts,
    to_engine_messages,
)
from omnivoice.server.chat.sse import DONE, EventStreamResponse, sse_event
from omnivoice.server.chat.tools import tool_texts
from omnivoice.server.errors import (
    APIError,
    bad_request,
    not_found,
    read_json_object,
    server_overloaded,
    shutting_down,
)
from omnivoice.server.json_bounds import JsonBounds
from omnivoice.types import (
    ChatMessage,
    GenerationRequest,
    ImagePart,
    Prompt,
    PromptTooLong,
    Sampling,
    text_exceeds,
)

log = logging.getLogger(__name__)


async def chat_completions(request: Request) -> Response | EventStreamResponse:
    arrived = time.perf_counter()
    state = request.app.state
    rid = request.state.request_id
    try:
        engine = state.lifecycle.require()
        slot = state.admission.acquire()
    except APIError as e:
        state.metrics.count(_refused(e))
        raise
    handed_off, timer = False, None
    try:
        req, gen, turn = await _prepare(request, engine, state.profile)
        why = engine.overloaded(gen)  # refuse now, before a 200 and a stream that could only fail
        if why is not None:
            raise server_overloaded(why)
        if turn.want_audio:  # within the engine's measured real-time capacity, or 503
            slot.take_stream()
        modalities = "+".join(m for m, on in (("text", turn.want_text), ("audio", turn.want_audio)) if on)
        log.info(
            "request %s: %s stream=%s modalities=%s prompt_tokens=%d",
            rid, turn.id, req.stream, modalities, len(gen.prompt.input_ids),
        )  # fmt: skip
        state.metrics.prepare.observe(time.perf_counter() - arrived)
        timer = state.metrics.start_request(arrived)
        if req.stream:
            handed_off = True  # the response releases the slot when it ends, however it ends
            events = stream(engine, gen, turn, timer, rid)
            return EventStreamResponse(
                events,
                on_close=slot.release,
                send_timeout_s=state.profile.server.send_timeout_s,
                stop=state.drain.expired,
                farewell=sse_event(shutting_down().body()) + DONE,
                label=f"request {rid}",
            )
        return await complete(request, engine, gen, turn, timer)
    except Exception as e:
        if timer is not None:
            timer.finish("error")  # no-op if the request already recorded its outcome
        elif isinstance(e, APIError) and e.status in (429, 503):
            state.metrics.count(_refused(e))
        else:
            client_error = isinstance(e, APIError) and e.status < 500
            state.metrics.count("invalid" if client_error else "error")
        raise
    finally:
        if not handed_off:
            slot.release()


def _refused(e: APIError) -> str:
    """The metrics status of a request refused before it ran."""
    return "rejected" if e.status == 429 or e.code == "server_overloaded" else "unavailable"


async def _prepare(
    request: Request, engine: EngineAPI, profile: Profile
) -> tuple[ChatRequest, GenerationRequest, Turn]:
    s = profile.server
    body = await read_json_object(
        request, s.max_body_bytes, JsonBounds(s.max_json_elements, s.max_json_depth)
    )
    # Validating, decoding audio and tokenizing are CPU work, in proportion to what the client sent:
    # it runs off the event loop, so one large request never stalls the others. A short text-only
    # request costs less than the hop to a worker thread and back (which, with many arriving at once,
    # waits on the GIL for each): it is prepared here.
    if light_request(body):
        req, prompt, voice = _request_and_prompt(body, engine, profile)
    else:
        req, prompt, voice = await asyncio.to_thread(_request_and_prompt, body, engine, profile)
    info = engine.info
    want = req.output_modalities
    turn = Turn(
        id=f"chatcmpl-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=info.served_name,
        want_text="text" in want,
        want_audio="audio" in want,
        audio_format=req.audio.format if req.audio else "wav",
        include_usage=req.include_usage,
    )
    gen = GenerationRequest(
        request_id=turn.id,
        prompt=prompt,
        want_audio=turn.want_audio,
        voice=voice,
        thinker=_thinker_sampling(req, profile),
        talker=_talker_sampling(req, profile),
        tools=req.offered_tools,
    )
    return req, gen, turn


# a request prepared on the event loop holds at most this much text and so many messages (a millisecond)
INLINE_TEXT_CHARS = 4096
INLINE_MESSAGES = 32


def light_request(body: dict[str, Any]) -> bool:
    """Whether `body` is cheap to prepare: at most INLINE_MESSAGES messages, only text,
    INLINE_TEXT_CHARS in all at most, no calls in its history, and no tools or response format (whose
    schemas are compiled). A body whose messages are not a list is light: its validation refuses it
    at once."""
    if body.get("tools") or body.get("functions"):
        return False
    if body.get("response_format") not in (None, {"type": "text"}):
        return False
    messages = body.get("messages")
    if not isinstance(messages, list):
        return True
    if len(messages) > INLINE_MESSAGES:
        return False
    chars = 0
    for message in messages:
        if not isinstance(message, dict) or message.get("tool_calls"):
            return False  # calls' arguments are text too; or a message its validation refuses
        content = message.get("content")
        parts = [content] if isinstance(content, str) else content if isinstance(content, list) else []
        for part in parts:
            if isinstance(part, dict) and part.get("type") == "text":
                part = part.get("text")
            if not isinstance(part, str):
                return False  # audio, an image, or a part to be refused with its own message
            chars += len(part)
    return chars <= INLINE_TEXT_CHARS


def _request_and_prompt(
    body: dict[str, Any], engine: EngineAPI, profile: Profile
) -> tuple[ChatRequest, Prompt, str]:
    """The validated request, its prompt and voice; the cheap checks first, so that a request that
    cannot be served is refused before the costly work (decoding audio, tokenizing)."""
    info = engine.info
    check_room(body, info.max_prompt_tokens)
    req = parse_chat_request(body)
    if req.model is not None and req.model != info.served_name:
        message = f"the model {req.model!r} does not exist; this server serves {info.served_name!r}"
        raise not_found(message, param="model", code="model_not_found")
    voice = (req.audio.voice if req.audio else None) or info.default_voice
    if "audio" in req.output_modalities:
        check_voice(voice, info.voices)
    grammar = req.response_grammar
    if grammar is not None:
        try:
            engine.check_grammar(grammar)
        except ValueError as e:
            message = f"response_format: the schema cannot be used: {e}"
            raise bad_request(message, param="response_format", code="invalid_schema") from None
    texts = prompt_texts(req)
    if text_exceeds(texts, info.max_prompt_chars):
        part = (
            "tools" if text_exceeds(tool_texts(req.offered_tools, []), info.max_prompt_chars) else "messages"
        )
        raise context_length_exceeded(
            f"the {part} hold {sum(map(len, texts))} characters of text, more than a prompt of "
            f"{info.max_prompt_tokens} tokens can hold",
            part,
        )
    messages = to_engine_messages(req, profile.server.max_audio_seconds, profile.server.max_image_pixels)
    check_image_budget(messages, profile.server.max_request_image_pixels)
    tools = req.offered_tools
    if tools is not None:
        try:
            engine.check_tools(tools)  # a required call is enforced with the functions' schemas
        except ValueError as e:
            message = f"tools: the parameters cannot be used: {e}"
            raise bad_request(message, param="tools", code="invalid_schema") from None
    try:
        prompt = engine.build_prompt(messages, tools.functions if tools else ())
    except PromptTooLong as e:  # known from the images' sizes, before any was decoded
        raise context_length_exceeded(str(e)) from None
    except ValueError as e:  # the engine's PromptError: a user-facing message
        raise bad_request(str(e), param="messages") from None
    if len(prompt.input_ids) > info.max_prompt_tokens:
        message = f"the prompt has {len(prompt.input_ids)} tokens; the limit is {info.max_prompt_tokens}"
        raise context_length_exceeded(message, _too_long_part(engine, messages, tools is not None))
    return req, prompt, voice


def _too_long_part(engine: EngineAPI, messages: Sequence[ChatMessage], tools: bool) -> str:
    """The part that makes a prompt too long: "tools" when the messages alone would fit."""
    if not tools:
        return "messages"
    try:
        alone = engine.build_prompt(messages)
    except ValueError:
        return "messages"
    return "tools" if len(alone.input_ids) <= engine.info.max_prompt_tokens else "messages"


def check_image_budget(messages: Sequence[ChatMessage], max_pixels: int) -> None:
    """A 400 when the request's images hold more than `max_pixels` pixels in all (from their headers)."""
    total = sum(p.shape[0] * p.shape[1] for m in messages for p in m.parts if isinstance(p, ImagePart))
    if total > max_pixels:
        message = (
            f"the request's images hold {total} pixels in all; the limit is {max_pixels} "
            "(server.max_request_image_pixels)"
        )
        raise bad_request(message, param="messages", code="image_budget_exceeded")


def _thinker_sampling(req: ChatRequest, profile: Profile) -> Sampling:
    d = profile.stages.thinker.sampling
    max_tokens = req.max_text_tokens or d.max_tokens
    context = profile.stages.thinker.max_seq_len
    if max_tokens > context:  # (a prompt and its answer share the thinker's context)
        param = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
        message = f"{param} is {max_tokens}; the model's context is {context} tokens"
        raise bad_request(message, param=param, code="invalid_value")
    min_tokens = max_tokens if req.ignore_eos else (req.min_tokens or 0)
    if min_tokens > max_tokens:
        raise bad_request(f"min_tokens ({min_tokens}) exceeds max_tokens ({max_tokens})", param="min_tokens")
    return d.for_request(
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        seed=req.seed,
        grammar=req.response_grammar,
    )


def _talker_sampling(req: ChatRequest, profile: Profile) -> Sampling:
    """The talker keeps the profile's sampling; a request may only narrow its frame budget."""
    d = profile.stages.talker.sampling
    max_frames = req.max_audio_frames or d.max_tokens
    if max_frames > d.max_tokens:
        message = f"max_audio_frames is at most {d.max_tokens} on this server"
        raise bad_request(message, param="max_audio_frames")
    min_frames = min(req.min_audio_frames or 0, max_frames)
    return d.for_request(max_tokens=max_frames, min_tokens=min_frames, seed=req.seed)
