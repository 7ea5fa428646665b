"""The session's settings: `session.update` payloads (GA and beta shapes) in, the effective settings out.

A patch is validated whole before any of it applies (a bad field leaves the session unchanged), then
merged. Fields OpenAI defines that we do not act on (tracing, noise reduction, speed, temperature, ...)
are accepted and echoed; those that ask for what this server cannot do (a stored `prompt`, MCP tools)
are refused, naming the field; unknown fields are rejected with their name. `tools` and
`tool_choice` are session/tools.py's.

`semantic_vad` is server VAD plus the end-of-turn model (session/end_of_turn.py): at each pause the model
scores the turn, a probability of "done" at or above its eagerness's bar ends the turn at once, and
otherwise the turn waits for speech or for the eagerness's ceiling of silence (`SEMANTIC_EAGERNESS`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from omnivoice.audio.formats import FORMATS, FORMATS_BY_MIME, PCM16, AudioFormat
from omnivoice.server.session.tools import (
    FunctionToolParam,
    SessionTools,
    ToolChoiceParam,
    ToolsError,
    resolve_tools,
)


@dataclass(frozen=True)
class Eagerness:
    """How a `semantic_vad` eagerness ends turns: at a pause the end-of-turn model's probability of
    "done" at or above `done` ends the turn there; otherwise `ceiling_ms` of silence ends it."""

    ceiling_ms: int
    done: float


# `low` waits longest for a caller to go on, `high` answers soonest; `auto` is `medium`, as OpenAI's.
SEMANTIC_EAGERNESS = {
    "low": Eagerness(ceiling_ms=2000, done=0.9),
    "medium": Eagerness(ceiling_ms=1000, done=0.8),
    "auto": Eagerness(ceiling_ms=1000, done=0.8),
    "high": Eagerness(ceiling_ms=600, done=0.5),
}
# the fields of each turn_detection type (OpenAI's): another type's field is refused, naming it
_SERVER_VAD_ONLY = ("threshold", "prefix_padding_ms", "silence_duration_ms", "idle_timeout_ms")
# OpenAI's voice names: clients send them by default; they map to the model's default voice.
OPENAI_VOICES = frozenset(
    [
        "alloy",
        "ash",
        "ballad",
        "coral",
        "echo",
        "fable",
        "onyx",
        "nova",
        "sage",
        "shimmer",
        "verse",
        "marin",
        "cedar",
    ]
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FormatParam(_Strict):
    type: Literal["audio/pcm", "audio/pcmu", "audio/pcma"]
    rate: Literal[24000] | None = None


class TurnDetectionParam(_Strict):
    type: Literal["server_vad", "semantic_vad"] = "server_vad"
    threshold: float | None = Field(None, ge=0.0, le=1.0)
    prefix_padding_ms: int | None = Field(None, ge=0, le=10_000)
    silence_duration_ms: int | None = Field(None, ge=0, le=10_000)
    create_response: bool | None = None
    interrupt_response: bool | None = None
    idle_timeout_ms: int | None = None
    eagerness: Literal["low", "medium", "high", "auto"] | None = None


class TranscriptionParam(_Strict):
    """`audio.input.transcription` (beta: `input_audio_transcription`). Any `model` is accepted: the
    served model transcribes; language, languages, keywords and prompt go into its instruction."""

    model: str | None = Field(None, max_length=200)
    language: str | None = Field(None, max_length=32)
    languages: list[Annotated[str, Field(max_length=32)]] | None = Field(None, max_length=16)
    keywords: list[Annotated[str, Field(max_length=200)]] | None = Field(None, max_length=100)
    prompt: str | None = None
    delay: Literal["minimal", "low", "medium", "high", "xhigh"] | None = None


class InputAudioParam(_Strict):
    format: FormatParam | Literal["pcm16", "g711_ulaw", "g711_alaw"] | None = None
    turn_detection: TurnDetectionParam | None = Field(default=None)
    transcription: TranscriptionParam | None = None
    noise_reduction: dict[str, Any] | None = None


class OutputAudioParam(_Strict):
    format: FormatParam | Literal["pcm16", "g711_ulaw", "g711_alaw"] | None = None
    voice: str | None = None
    speed: float | None = None


class AudioParam(_Strict):
    input: InputAudioParam | None = None
    output: OutputAudioParam | None = None


class OmnivoiceParam(_Strict):
    """Extension: fixed output lengths on a random-weight model (tests and benchmarks), and whether a
    server-VAD turn's response starts speculatively (the profile's `realtime.speculative_response`)."""

    min_output_tokens: int | None = Field(None, ge=0)
    output_audio_frames: int | None = Field(None, ge=1, description="talker frames: min = max")
    speculative_response: bool | None = None


class SessionPatch(_Strict):
    """A `session.update` `session` object: GA fields, the beta names, and our extension."""

    type: Literal["realtime"] | None = None
    id: str | None = None
    object: str | None = None
    model: str | None = None
    instructions: str | None = None
    output_modalities: list[Literal["text", "audio"]] | None = None
    audio: AudioParam | None = None
    max_output_tokens: int | Literal["inf"] | None = None
    tools: list[FunctionToolParam] | None = None
    tool_choice: ToolChoiceParam | None = None
    tracing: Any = None
    truncation: Any = None
    prompt: Any = None
    include: list[str] | None = None
    expires_at: int | None = None
    # beta names
    modalities: list[Literal["text", "audio"]] | None = None
    voice: str | None = None
    input_audio_format: Literal["pcm16", "g711_ulaw", "g711_alaw"] | None = None
    output_audio_format: Literal["pcm16", "g711_ulaw", "g711_alaw"] | None = None
    turn_detection: TurnDetectionParam | None = None
    input_audio_transcription: TranscriptionParam | None = None
    input_audio_noise_reduction: dict[str, Any] | None = None
    max_response_output_tokens: int | Literal["inf"] | None = None
    temperature: float | None = None
    speed: float | None = None
    client_secret: Any = None
    omnivoice: OmnivoiceParam | None = None


@dataclass(frozen=True)
class TurnDetection:
    type: Literal["server_vad", "semantic_vad"] = "server_vad"
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: int | None = None
    eagerness: str = "auto"

    @property
    def semantic(self) -> Eagerness | None:
        """How the end-of-turn model ends this turn detection's turns; None for server_vad."""
        return SEMANTIC_EAGERNESS[self.eagerness] if self.type == "semantic_vad" else None

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": self.type,
            "create_response": self.create_response,
            "interrupt_response": self.interrupt_response,
        }
        if self.type == "semantic_vad":
            return {**out, "eagerness": self.eagerness}
        return {
            **out,
            "threshold": self.threshold,
            "prefix_padding_ms": self.prefix_padding_ms,
            "silence_duration_ms": self.silence_duration_ms,
            "idle_timeout_ms": self.idle_timeout_ms,
        }


@dataclass(frozen=True)
class Transcription:
    """How the caller's committed audio is transcribed (see session/transcription.py)."""

    model: str = "omnivoice"
    language: str | None = None
    languages: tuple[str, ...] = ()
    keywords: tuple[str, ...] = ()
    prompt: str | None = None
    delay: str | None = None

    @classmethod
    def of(cls, p: TranscriptionParam) -> Transcription:
        return cls(
            model=p.model or "omnivoice",
            language=p.language,
            languages=tuple(p.languages or ()),
            keywords=tuple(p.keywords or ()),
            prompt=p.prompt,
            delay=p.delay,
        )

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, "language": self.language, "prompt": self.prompt or ""}
        if self.languages:
            out["languages"] = list(self.languages)
        if self.keywords:
            out["keywords"] = list(self.keywords)
        if self.delay is not None:
            out["delay"] = self.delay
        return out


@dataclass(frozen=True)
class SessionSettings:
    """The effective settings of one session."""

    voice: str
    instructions: str | None = None
    output_modalities: tuple[str, ...] = ("audio",)
    input_format: AudioFormat = PCM16
    output_format: AudioFormat = PCM16
    turn_detection: TurnDetection | None = field(default_factory=TurnDetection)
    transcription: Transcription | None = None  # None: the caller's audio is not transcribed
    tools: SessionTools = field(default_factory=SessionTools)
    max_output_tokens: int | None = None  # None: "inf" (the profile's cap)
    min_output_tokens: int | None = None
    output_audio_frames: int | None = None
    # server VAD: start the response when speech pauses, held until the silence window confirms the turn
    speculative_response: bool = True
    echo: dict[str, Any] = field(default_factory=dict)  # accepted, not acted on: echoed back


class SettingsError(ValueError):
    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def resolve_format(value: FormatParam | str | None, current: AudioFormat) -> AudioFormat:
    if value is None:
        return current
    return FORMATS[value] if isinstance(value, str) else FORMATS_BY_MIME[value.type]


def resolve_voice(voice: str, voices: tuple[str, ...], default: str, param: str) -> str:
    name = voice.lower()
    if name in voices:
        return name
    if name in OPENAI_VOICES:
        return default
    raise SettingsError(f"unknown voice {voice!r}; this model's voices are {', '.join(voices)}", param)


def apply_patch(
    s: SessionSettings, p: SessionPatch, voices: tuple[str, ...], default_voice: str
) -> SessionSettings:
    """The settings after `p`; raises SettingsError (nothing applied) on a value we cannot serve."""
    a_in = p.audio.input if p.audio else None
    a_out = p.audio.output if p.audio else None
    set_fields = p.model_fields_set
    td_set = "turn_detection" in set_fields or (
        a_in is not None and "turn_detection" in a_in.model_fields_set
    )
    td_param = a_in.turn_detection if a_in and "turn_detection" in a_in.model_fields_set else p.turn_detection
    tr_set = "input_audio_transcription" in set_fields or (
        a_in is not None and "transcription" in a_in.model_fields_set
    )
    tr_param = (
        a_in.transcription
        if a_in and "transcription" in a_in.model_fields_set
        else p.input_audio_transcription
    )
    voice_in = (a_out.voice if a_out else None) or p.voice
    modalities = p.output_modalities or p.modalities
    tokens = p.max_output_tokens if p.max_output_tokens is not None else p.max_response_output_tokens
    changes: dict[str, Any] = {
        "input_format": resolve_format(
            (a_in.format if a_in else None) or p.input_audio_format, s.input_format
        ),
        "output_format": resolve_format(
            (a_out.format if a_out else None) or p.output_audio_format, s.output_format
        ),
    }
    if voice_in is not None:
        param = "session.audio.output.voice" if a_out and a_out.voice else "session.voice"
        changes["voice"] = resolve_voice(voice_in, voices, default_voice, param)
    if "instructions" in set_fields:
        changes["instructions"] = p.instructions
    if modalities is not None:
        if not modalities:
            raise SettingsError("output_modalities must not be empty", "session.output_modalities")
        changes["output_modalities"] = ("audio",) if "audio" in modalities else ("text",)
    if tokens is not None:
        changes["max_output_tokens"] = None if tokens == "inf" else _positive(tokens, "max_output_tokens")
    if td_set:
        beta = a_in is None or "turn_detection" not in a_in.model_fields_set
        where = "session.turn_detection" if beta else "session.audio.input.turn_detection"
        changes["turn_detection"] = None if td_param is None else _turn_detection(td_param, where)
    if tr_set:
        changes["transcription"] = None if tr_param is None else Transcription.of(tr_param)
    if p.omnivoice is not None:
        changes["min_output_tokens"] = p.omnivoice.min_output_tokens
        changes["output_audio_frames"] = p.omnivoice.output_audio_frames
        if p.omnivoice.speculative_response is not None:  # unset: the session's (the profile's) stays
            changes["speculative_response"] = p.omnivoice.speculative_response
    try:
        changes["tools"] = resolve_tools(s.tools, p.tools, p.tool_choice, "session")
    except ToolsError as err:
        raise SettingsError(str(err), err.param) from None
    if p.prompt is not None:
        raise SettingsError("stored prompts are not supported by this server", "session.prompt")
    echo = dict(s.echo)
    for key in ("tracing", "truncation", "prompt", "include", "temperature", "speed"):
        if key in set_fields:
            echo[key] = getattr(p, key)
    changes["echo"] = echo
    return replace(s, **changes)


def _positive(value: int, name: str) -> int:
    if value < 1:
        raise SettingsError(f"{name} must be >= 1 or 'inf'", f"session.{name}")
    return value


def _turn_detection(p: TurnDetectionParam, where: str) -> TurnDetection:
    """A new turn_detection object replaces the old one, as OpenAI does; `where` names it in errors."""
    base = TurnDetection()
    if p.type == "semantic_vad":  # a field sent as null is as good as left out
        wrong = [f for f in _SERVER_VAD_ONLY if getattr(p, f) is not None]
        if wrong:
            message = f"{wrong[0]} is a server_vad setting; semantic_vad takes eagerness instead"
            raise SettingsError(message, f"{where}.{wrong[0]}")
    elif p.eagerness is not None:
        raise SettingsError("eagerness is a semantic_vad setting", f"{where}.eagerness")
    silence = p.silence_duration_ms
    if p.type == "semantic_vad":
        silence = SEMANTIC_EAGERNESS[p.eagerness or "auto"].ceiling_ms
    return TurnDetection(
        type=p.type,
        threshold=base.threshold if p.threshold is None else p.threshold,
        prefix_padding_ms=base.prefix_padding_ms if p.prefix_padding_ms is None else p.prefix_padding_ms,
        silence_duration_ms=base.silence_duration_ms if silence is None else silence,
        create_response=base.create_response if p.create_response is None else p.create_response,
        interrupt_response=base.interrupt_response if p.interrupt_response is None else p.interrupt_response,
        idle_timeout_ms=p.idle_timeout_ms,
        eagerness=p.eagerness or "auto",
    )
