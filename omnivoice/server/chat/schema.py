"""The `/v1/chat/completions` request: pydantic models and their conversion to engine messages.

Keys that only describe the request (`user`, `metadata`, `store`, `name`, `service_tier`, vLLM
extras, ...) are tolerated; every key we act on is validated, and what this model cannot do (images,
video, n > 1) fails with a 400 naming the offending field. Function calling (`tools`, `tool_choice`,
`parallel_tool_calls`, and the history's tool turns) is in `chat.tools`. OpenAI parameters that ask
for something this server does not do (`logprobs`, `stop`, the legacy `functions`...; see
UNSUPPORTED) are refused with a 400 `unsupported_parameter` naming them, unless their value asks for
nothing (null, `false`, `0`, `[]`...), as SDKs and careful clients send.
`response_format` (`text`, `json_object`, `json_schema`) becomes the grammar the thinker's answer is
held to (`response_grammar`).
Extensions for fixed-length benchmarks: `min_tokens` and `ignore_eos` (as in vLLM) for the text,
`min_audio_frames` / `max_audio_frames` for the talker's codec frames (12.5 per second of audio).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from omnivoice.server.chat.content import ContentPart, Lenient, TextContent, engine_part
from omnivoice.server.chat.tools import (
    ToolCallIn,
    ToolChoice,
    ToolDef,
    check_tool_turn,
    check_tools,
    offered_tools,
    tool_choice_shape,
    tool_texts,
    tool_turn_error,
)
from omnivoice.server.errors import APIError, bad_request
from omnivoice.types import ChatMessage, Grammar, ToolCall, Tools

_UNSUPPORTED_PARTS = {"input_image", "image", "video_url", "video", "file", "input_file"}
# OpenAI parameters this server does not implement, each with the values that ask for nothing.
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "logit_bias": (None, {}),
    "stop": (None, [], ""),
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
    "prediction": (None,),
    "web_search_options": (None,),
    "reasoning_effort": (None,),
}
MAX_PROBLEMS = 5  # validation problems listed in an error message
ENGINE_ROLES: dict[str, Literal["system", "user", "assistant", "tool"]] = {
    "system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool",
}  # fmt: skip
# A prompt spends at least this many tokens on each message: <|im_start|>, the role, "\n", <|im_end|>, "\n".
MESSAGE_TOKENS = 5


class Message(Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: list[ContentPart] | None = None
    tool_calls: list[ToolCallIn] | None = None  # assistant only
    tool_call_id: str | None = None  # tool only: the call it answers
    function_call: Any = None  # the legacy form: refused

    @field_validator("content", mode="before")
    @classmethod
    def _normalize(cls, v: Any) -> Any:
        if isinstance(v, str):
            return [{"type": "text", "text": v}]
        if isinstance(v, list):
            for part in v:
                kind = part.get("type") if isinstance(part, dict) else None
                if isinstance(kind, str) and kind in _UNSUPPORTED_PARTS:  # a list or dict is unhashable
                    raise ValueError(
                        f"{kind!r} content is not supported by this model (text, audio and image_url only)"
                    )
        elif v is not None:
            raise ValueError("must be a string or a list of content parts")
        return v


class AudioOutput(Lenient):
    voice: str | None = None
    format: Literal["wav", "pcm16"] = "wav"


class StreamOptions(Lenient):
    include_usage: bool = False


class TextFormat(Lenient):
    type: Literal["text"]


class JsonObjectFormat(Lenient):
    type: Literal["json_object"]


class JsonSchemaSpec(Lenient):
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]+$", max_length=64)
    description: str | None = None
    # `schema` would shadow BaseModel.schema(); the JSON key is still "schema"
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None  # the schema is enforced either way


class JsonSchemaFormat(Lenient):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")]


class ChatRequest(Lenient):
    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    modalities: list[Literal["text", "audio"]] | None = Field(None, max_length=2)
    audio: AudioOutput | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=-(2**63), lt=2**63)  # OpenAI's int64; torch takes no more
    n: int | None = None
    # Fixed-length benchmarking: vLLM's `min_tokens` / `ignore_eos`, and omnivoice's codec-frame bounds.
    min_tokens: int | None = Field(None, ge=0)
    ignore_eos: bool = False
    min_audio_frames: int | None = Field(None, ge=0)
    max_audio_frames: int | None = Field(None, ge=1)
    response_format: ResponseFormat | None = None
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None

    @field_validator("modalities")
    @classmethod
    def _modalities(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and (not v or len(set(v)) != len(v)):
            raise ValueError('must be ["text"], ["audio"] or ["text", "audio"]')
        return v

    _tool_choice = field_validator("tool_choice", mode="before")(tool_choice_shape)

    @field_validator("n")
    @classmethod
    def _one_choice(cls, v: int | None) -> int | None:
        if v not in (None, 1):
            raise ValueError("only n=1 is supported")
        return v

    @model_validator(mode="after")
    def _bounds(self) -> ChatRequest:
        lo, hi = self.min_audio_frames, self.max_audio_frames
        if lo is not None and hi is not None and lo > hi:
            raise ValueError("min_audio_frames must be <= max_audio_frames")
        return self

    @property
    def max_text_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def output_modalities(self) -> frozenset[str]:
        # Default to text and audio like vLLM-Omni (its benchmark sends no `modalities`).
        return frozenset(self.modalities or ("text", "audio"))

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def response_grammar(self) -> Grammar | None:
        """The grammar `response_format` holds the answer to: any JSON object, or JSON of the schema
        (an empty schema: any JSON value); None for text."""
        fmt = self.response_format
        if isinstance(fmt, JsonObjectFormat):
            return Grammar("json_schema", json.dumps({"type": "object"}))
        if isinstance(fmt, JsonSchemaFormat):
            return Grammar("json_schema", json.dumps(fmt.json_schema.schema_, ensure_ascii=False))
        return None

    @property
    def offered_tools(self) -> Tools | None:
        """The functions the model is offered, and how it must use them (None: none)."""
        return offered_tools(self.tools, self.tool_choice, self.parallel_tool_calls)


def check_room(body: dict[str, Any], max_tokens: int) -> None:
    """Refuse, before validating the body, more messages or content parts than a prompt of at most
    `max_tokens` can hold: validating many small objects is slow work that could only fail.

    Each message costs MESSAGE_TOKENS, each content part that says anything at least one token.
    """
    messages = body.get("messages")
    if not isinstance(messages, list):
        return  # validation says what is wrong
    if len(messages) * MESSAGE_TOKENS > max_tokens:
        raise context_length_exceeded(
            f"{len(messages)} messages take at least {len(messages) * MESSAGE_TOKENS} prompt tokens; "
            f"the limit is {max_tokens}"
        )
    parts = sum(len(c) for m in messages if isinstance(m, dict) and isinstance(c := m.get("content"), list))
    if parts > max_tokens:
        raise context_length_exceeded(
            f"the messages have {parts} content parts, more than the {max_tokens} tokens a prompt may have"
        )


def context_length_exceeded(message: str, param: str = "messages") -> APIError:
    """A 400 for a prompt too long for the model, naming the part that makes it so."""
    return bad_request(message, param=param, code="context_length_exceeded")


def parse_chat_request(body: dict[str, Any]) -> ChatRequest:
    """Validate a request body; a 400 APIError names the first problem as `param` and lists a few."""
    for name, nothing in UNSUPPORTED.items():
        if name in body and body[name] not in nothing:
            raise unsupported(name)
    try:
        req = ChatRequest.model_validate(body)
    except ValidationError as err:
        problems = [(_loc(e["loc"]), _msg(e)) for e in err.errors()]
        shown = [f"{loc}: {msg}" if loc else msg for loc, msg in problems[:MAX_PROBLEMS]]
        more = f" (and {len(problems) - MAX_PROBLEMS} more)" if len(problems) > MAX_PROBLEMS else ""
        raise bad_request("; ".join(shown) + more, param=problems[0][0] or None) from None
    check_tools(req.tools, req.tool_choice)
    return req


def unsupported(param: str) -> APIError:
    message = f"Unsupported parameter: '{param}' is not supported by this server."
    return bad_request(message, param=param, code="unsupported_parameter")


def _loc(loc: tuple[int | str, ...]) -> str:
    out, prev = "", None
    for p in loc:
        if p != prev:  # a discriminated union repeats its tag: content[0].input_audio.input_audio.data
            out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
        prev = p
    return out


def _msg(e: Any) -> str:
    if e["type"] == "value_error":
        return str(e["ctx"]["error"])
    return str(e["msg"])


def to_engine_messages(
    req: ChatRequest, max_audio_seconds: float, max_image_pixels: int
) -> tuple[ChatMessage, ...]:
    """Map OpenAI messages to engine messages, decoding audio and images; raises a 400 APIError."""
    out = []
    call_ids: set[str] = set()  # of the calls made so far: a tool message answers one of them
    for i, m in enumerate(req.messages):
        where = f"messages[{i}]"
        if m.role == "function":
            raise bad_request(f"{where}: role 'function' is not supported; use 'tool'", param=where)
        if m.function_call is not None:
            raise unsupported(f"{where}.function_call")
        if m.tool_calls and m.role != "assistant":
            raise tool_turn_error(where, "only assistant messages make tool calls", ".tool_calls")
        if m.role == "tool":
            check_tool_turn(where, m.tool_call_id, call_ids)
        calls = tuple(ToolCall(c.id, c.function.name, c.function.arguments) for c in m.tool_calls or ())
        call_ids.update(c.id for c in calls)
        if not m.content and not calls:
            raise bad_request(f"{where}: content is required", param=f"{where}.content")
        if m.role in ("assistant", "tool") and any(not isinstance(p, TextContent) for p in m.content or ()):
            raise bad_request(f"{where}: {m.role} content must be text", param=f"{where}.content")
        content = enumerate(m.content or ())
        parts = tuple(
            engine_part(p, f"{where}.content[{j}]", max_audio_seconds, max_image_pixels) for j, p in content
        )
        role = ENGINE_ROLES[m.role]
        out.append(ChatMessage(role=role, parts=parts, tool_calls=calls, tool_call_id=m.tool_call_id))
    return tuple(out)


def prompt_texts(req: ChatRequest) -> list[str]:
    """The text of every message, the offered functions and the history's calls, as the prompt will
    hold them."""
    texts = [p.text for m in req.messages for p in m.content or () if isinstance(p, TextContent)]
    calls = [c for m in req.messages for c in m.tool_calls or ()]
    return texts + tool_texts(req.offered_tools, calls)


def check_voice(voice: str, voices: tuple[str, ...]) -> None:
    if voice not in voices:
        raise APIError(
            400,
            f"unknown voice {voice!r}; available: {', '.join(voices)}",
            param="audio.voice",
            code="invalid_voice",
        )
