"""The `/v1/chat/completions` request: pydantic models and their conversion to engine messages.

Keys that only describe the request (`user`, `metadata`, `store`, `name`, `service_tier`, vLLM
extras, ...) are tolerated; every key we act on is validated, and what this model cannot do (tool
messages, images, video, n > 1) fails with a 400 naming the offending field. OpenAI parameters that
ask for something this server does not do (`tools`, `logprobs`, `stop`, ...; see
UNSUPPORTED) are refused with a 400 `unsupported_parameter` naming them, unless their value asks for
nothing (null, `false`, `0`, `[]`, `tool_choice: "none"`...), as SDKs and careful clients send.
`response_format` (`text`, `json_object`, `json_schema`) becomes the grammar the thinker's answer is
held to (`response_grammar`).
Extensions for fixed-length benchmarks: `min_tokens` and `ignore_eos` (as in vLLM) for the text,
`min_audio_frames` / `max_audio_frames` for the talker's codec frames (12.5 per second of audio).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from omnivoice.audio import AudioDecodeError, decode_base64_audio
from omnivoice.server.errors import APIError, bad_request
from omnivoice.types import AudioPart, ChatMessage, Grammar, TextPart

_UNSUPPORTED_PARTS = {"image_url", "input_image", "image", "video_url", "video", "file", "input_file"}
# OpenAI parameters this server does not implement, each with the values that ask for nothing.
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),  # "auto" without tools chooses none
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
# A prompt spends at least this many tokens on each message: <|im_start|>, the role, "\n", <|im_end|>, "\n".
MESSAGE_TOKENS = 5


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class TextContent(_Lenient):
    type: Literal["text"]
    text: str


class InputAudio(_Lenient):
    data: str
    format: str = "wav"  # checked when decoding, so the error can list what is supported


class InputAudioContent(_Lenient):
    type: Literal["input_audio"]
    input_audio: InputAudio


class AudioURL(_Lenient):
    url: str


class AudioURLContent(_Lenient):
    """vLLM's `audio_url` part; only `data:audio/wav;base64,...` URLs (the server fetches nothing)."""

    type: Literal["audio_url"]
    audio_url: AudioURL


ContentPart = Annotated[TextContent | InputAudioContent | AudioURLContent, Field(discriminator="type")]


class Message(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: list[ContentPart] | None = None
    tool_calls: list[Any] | None = None  # refused unless empty: no tool calling
    function_call: Any = None

    @field_validator("content", mode="before")
    @classmethod
    def _normalize(cls, v: Any) -> Any:
        if isinstance(v, str):
            return [{"type": "text", "text": v}]
        if isinstance(v, list):
            for part in v:
                kind = part.get("type") if isinstance(part, dict) else None
                if isinstance(kind, str) and kind in _UNSUPPORTED_PARTS:  # a list or dict is unhashable
                    raise ValueError(f"{kind!r} content is not supported by this model (text and audio only)")
        elif v is not None:
            raise ValueError("must be a string or a list of content parts")
        return v


class AudioOutput(_Lenient):
    voice: str | None = None
    format: Literal["wav", "pcm16"] = "wav"


class StreamOptions(_Lenient):
    include_usage: bool = False


class TextFormat(_Lenient):
    type: Literal["text"]


class JsonObjectFormat(_Lenient):
    type: Literal["json_object"]


class JsonSchemaSpec(_Lenient):
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]+$", max_length=64)
    description: str | None = None
    # `schema` would shadow BaseModel.schema(); the JSON key is still "schema"
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None  # the schema is enforced either way


class JsonSchemaFormat(_Lenient):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")]


class ChatRequest(_Lenient):
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

    @field_validator("modalities")
    @classmethod
    def _modalities(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and (not v or len(set(v)) != len(v)):
            raise ValueError('must be ["text"], ["audio"] or ["text", "audio"]')
        return v

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


def context_length_exceeded(message: str) -> APIError:
    return bad_request(message, param="messages", code="context_length_exceeded")


def parse_chat_request(body: dict[str, Any]) -> ChatRequest:
    """Validate a request body; a 400 APIError names the first problem as `param` and lists a few."""
    for name, nothing in UNSUPPORTED.items():
        if name in body and body[name] not in nothing:
            raise unsupported(name)
    try:
        return ChatRequest.model_validate(body)
    except ValidationError as err:
        problems = [(_loc(e["loc"]), _msg(e)) for e in err.errors()]
        shown = [f"{loc}: {msg}" if loc else msg for loc, msg in problems[:MAX_PROBLEMS]]
        more = f" (and {len(problems) - MAX_PROBLEMS} more)" if len(problems) > MAX_PROBLEMS else ""
        raise bad_request("; ".join(shown) + more, param=problems[0][0] or None) from None


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


def to_engine_messages(req: ChatRequest, max_audio_seconds: float) -> tuple[ChatMessage, ...]:
    """Map OpenAI messages to engine messages, decoding audio; raises a 400 APIError."""
    out = []
    for i, m in enumerate(req.messages):
        where = f"messages[{i}]"
        if m.role in ("tool", "function"):
            raise bad_request(f"{where}: role {m.role!r} is not supported (no tool calling)", param=where)
        if m.tool_calls or m.function_call is not None:
            raise unsupported(f"{where}.{'tool_calls' if m.tool_calls else 'function_call'}")
        if not m.content:
            raise bad_request(f"{where}: content is required", param=f"{where}.content")
        if m.role == "assistant" and any(not isinstance(p, TextContent) for p in m.content):
            raise bad_request(f"{where}: assistant content must be text", param=f"{where}.content")
        parts = tuple(_part(p, f"{where}.content[{j}]", max_audio_seconds) for j, p in enumerate(m.content))
        role: Literal["system", "user", "assistant"] = (
            "user" if m.role == "user" else "assistant" if m.role == "assistant" else "system"
        )
        out.append(ChatMessage(role=role, parts=parts))
    return tuple(out)


def prompt_texts(req: ChatRequest) -> list[str]:
    """The text of every message, as the prompt will hold it."""
    return [p.text for m in req.messages for p in m.content or () if isinstance(p, TextContent)]


def _part(p: ContentPart, where: str, max_audio_seconds: float) -> TextPart | AudioPart:
    if isinstance(p, TextContent):
        return TextPart(p.text)
    try:
        if isinstance(p, InputAudioContent):
            pcm, rate = decode_base64_audio(p.input_audio.data, p.input_audio.format)
        else:
            pcm, rate = decode_base64_audio(*_parse_audio_data_url(p.audio_url.url))
    except AudioDecodeError as e:
        raise bad_request(f"{where}: {e}", param=where, code="invalid_audio") from None
    if pcm.size == 0:
        raise bad_request(f"{where}: the audio has no samples", param=where, code="invalid_audio")
    seconds = pcm.size / rate
    if seconds > max_audio_seconds:
        message = f"{where}: audio is {seconds:.1f} s long; the limit is {max_audio_seconds:g} s"
        raise bad_request(message, param=where, code="audio_too_long")
    return AudioPart(pcm=pcm, sample_rate=rate)


def _parse_audio_data_url(url: str) -> tuple[str, str]:
    """`data:audio/wav;base64,XXXX` -> (XXXX, "wav")."""
    head, sep, data = url.partition(",")
    if not (url.startswith("data:") and sep and head.endswith(";base64")):
        raise AudioDecodeError("audio_url must be a base64 data URL (data:audio/wav;base64,...)")
    mime = head[len("data:") : -len(";base64")].lower()
    if mime not in ("audio/wav", "audio/x-wav", "audio/wave", "audio/vnd.wave"):
        raise AudioDecodeError(f"unsupported audio_url type {mime!r}; send audio/wav")
    return data, "wav"


def check_voice(voice: str, voices: tuple[str, ...]) -> None:
    if voice not in voices:
        raise APIError(
            400,
            f"unknown voice {voice!r}; available: {', '.join(voices)}",
            param="audio.voice",
            code="invalid_voice",
        )
