"""Client events of the OpenAI Realtime API (GA, plus the beta names), as typed models.

`parse_client_event(text)` returns one of the models below or raises `ProtocolError` with the code,
message and param that go back to the client in an `error` event. Unknown fields are rejected by name.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from omnivoice.server.json_bounds import JsonBounds
from omnivoice.server.session.tools import FunctionToolParam, ToolChoiceParam
from omnivoice.types import ModelInfo

_FIELD = re.compile(r"[a-z_][a-z0-9_]*")


class ProtocolError(Exception):
    """A client event we cannot act on; the session goes on."""

    def __init__(
        self, message: str, code: str, param: str | None = None, event_id: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param
        self.event_id = event_id


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Event(_Strict):
    event_id: str | None = None


class ContentParam(_Strict):
    type: Literal["input_text", "input_audio", "input_image", "output_text", "output_audio", "text", "audio"]
    text: str | None = None
    audio: str | None = None
    transcript: str | None = None
    image_url: str | None = None  # input_image: a base64 data URL
    detail: Literal["auto", "low", "high"] | None = None  # input_image: the processor decides


class ItemParam(_Strict):
    id: str | None = Field(None, max_length=64)
    type: Literal["message", "function_call", "function_call_output"] = "message"
    object: Literal["realtime.item"] | None = None
    role: Literal["user", "assistant", "system"] | None = None
    status: Literal["completed", "incomplete", "in_progress"] | None = None
    content: list[ContentParam] = Field(default_factory=list)
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | None = None


class ResponseAudioOutput(_Strict):
    format: Any = None  # checked when the response is planned, as a session's output format
    voice: str | None = None


class ResponseAudio(_Strict):
    output: ResponseAudioOutput | None = None


Tokens = Annotated[int, Field(ge=1)] | Literal["inf"]


class ResponseParams(_Strict):
    output_modalities: list[Literal["text", "audio"]] | None = None
    modalities: list[Literal["text", "audio"]] | None = None  # beta
    instructions: str | None = None
    voice: str | None = None  # beta
    output_audio_format: Literal["pcm16", "g711_ulaw", "g711_alaw"] | None = None  # beta
    audio: ResponseAudio | None = None
    max_output_tokens: Tokens | None = None
    max_response_output_tokens: Tokens | None = None  # beta
    conversation: str | None = None
    metadata: dict[str, str] | None = None
    input: list[Any] | None = None
    tools: list[FunctionToolParam] | None = None
    tool_choice: ToolChoiceParam | None = None
    temperature: float | None = None
    prompt: Any = None


class SessionUpdate(_Event):
    type: Literal["session.update"]
    session: dict[str, Any]


class AudioAppend(_Event):
    type: Literal["input_audio_buffer.append"]
    audio: str


class AudioCommit(_Event):
    type: Literal["input_audio_buffer.commit"]


class AudioClear(_Event):
    type: Literal["input_audio_buffer.clear"]


class ItemCreate(_Event):
    type: Literal["conversation.item.create"]
    previous_item_id: str | None = None
    item: ItemParam


class ItemRetrieve(_Event):
    type: Literal["conversation.item.retrieve"]
    item_id: str


class ItemDelete(_Event):
    type: Literal["conversation.item.delete"]
    item_id: str


class ItemTruncate(_Event):
    type: Literal["conversation.item.truncate"]
    item_id: str
    content_index: int = 0
    audio_end_ms: float


class ResponseCreate(_Event):
    type: Literal["response.create"]
    response: ResponseParams | None = None


class ResponseCancel(_Event):
    type: Literal["response.cancel"]
    response_id: str | None = None


class OutputAudioClear(_Event):
    type: Literal["output_audio_buffer.clear"]


ClientEvent = (
    SessionUpdate
    | AudioAppend
    | AudioCommit
    | AudioClear
    | ItemCreate
    | ItemRetrieve
    | ItemDelete
    | ItemTruncate
    | ResponseCreate
    | ResponseCancel
    | OutputAudioClear
)
_ADAPTER: TypeAdapter[ClientEvent] = TypeAdapter(Annotated[ClientEvent, Field(discriminator="type")])
EVENT_TYPES = (
    "session.update",
    "input_audio_buffer.append",
    "input_audio_buffer.commit",
    "input_audio_buffer.clear",
    "conversation.item.create",
    "conversation.item.retrieve",
    "conversation.item.delete",
    "conversation.item.truncate",
    "response.create",
    "response.cancel",
    "output_audio_buffer.clear",
)


def parse_client_event(text: str | bytes, bounds: JsonBounds | None = None) -> ClientEvent:
    """The client event `text` holds; ProtocolError if it is not one (or past `bounds`: checked before
    it is parsed, so no event stalls the session's loop)."""
    why = bounds.size_error(text) if bounds is not None else None
    if why is not None:
        raise ProtocolError(f"the event is too complex: {why}", "json_too_complex")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ProtocolError(f"the event is not valid JSON: {e}", "invalid_json") from None
    why = bounds.depth_error(data) if bounds is not None else None
    if why is not None:
        raise ProtocolError(f"the event is too complex: {why}", "json_too_complex")
    if not isinstance(data, dict):
        raise ProtocolError("an event must be a JSON object", "invalid_json")
    event_id = data.get("event_id") if isinstance(data.get("event_id"), str) else None
    if has_lone_surrogate(text, data):  # kept in an item or the instructions, it fails every prompt
        message = "the event has a string that is not valid Unicode (an unpaired \\ud800-\\udfff escape)"
        raise ProtocolError(message, "invalid_value", None, event_id)
    kind = data.get("type")
    if not isinstance(kind, str):
        raise ProtocolError("the event has no 'type'", "missing_required_parameter", "type", event_id)
    if kind not in EVENT_TYPES:
        message = f"Invalid value: {kind[:100]!r}. Supported values are: {', '.join(EVENT_TYPES)}."
        raise ProtocolError(message, "invalid_value", "type", event_id)
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as e:
        raise _validation_error(e, event_id) from None


def has_lone_surrogate(text: str | bytes, data: Any) -> bool:
    """Whether JSON `text` (parsed: `data`) has a string with an unpaired surrogate escape (\\ud800):
    valid JSON, but no text; the tokenizer raises on it."""
    escaped = b"\\u" in text if isinstance(text, bytes) else "\\u" in text
    if not escaped:  # the common case: no escape at all
        return False
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    except RecursionError:  # nested as deep as json.loads takes: validation refuses it anyway
        return False
    return False


def _validation_error(
    e: ValidationError, event_id: str | None, skip: int = 1, prefix: tuple[str, ...] = ()
) -> ProtocolError:
    """`skip` drops the discriminator's tag from the error location; `prefix` names the enclosing field."""
    first = e.errors()[0]
    # union members add their class or literal name to the location: not a field, leave it out
    loc = [*prefix, *(str(p) for p in first["loc"][skip:] if isinstance(p, int) or _FIELD.fullmatch(p))]
    last = first["loc"][-1] if first["loc"] else None
    if first["type"] == "extra_forbidden" and isinstance(last, str) and not _FIELD.fullmatch(last):
        loc.append(last[:64])  # an unknown key is named whatever it looks like
    param = ".".join(loc) or None
    if first["type"] == "extra_forbidden":
        return ProtocolError(f"Unknown parameter: '{param}'.", "unknown_parameter", param, event_id)
    if first["type"] == "missing":
        return ProtocolError(
            f"Missing required parameter: '{param}'.", "missing_required_parameter", param, event_id
        )
    return ProtocolError(f"Invalid value for '{param}': {first['msg']}.", "invalid_value", param, event_id)


def too_long(param: str, chars: int, info: ModelInfo, event_id: str | None) -> ProtocolError:
    """The error for text no prompt can hold (`ModelInfo.max_prompt_chars`), refused before it is kept."""
    message = (
        f"Invalid '{param}': string too long. The model's context of {info.max_prompt_tokens} tokens "
        f"holds at most {info.max_prompt_chars} characters, got {chars}."
    )
    return ProtocolError(message, "string_above_max_length", param, event_id)


def session_patch_error(e: ValidationError, event_id: str | None) -> ProtocolError:
    """A `session.update` whose `session` object failed validation; params are named `session.<key>`."""
    return _validation_error(e, event_id, skip=0, prefix=("session",))
