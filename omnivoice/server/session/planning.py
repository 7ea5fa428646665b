"""What a response should produce: the session settings, overridden by `response.create`'s `response`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from omnivoice.config import StagesConfig
from omnivoice.server.session.generation import ResponsePlan
from omnivoice.server.session.protocol import ProtocolError, ResponseAudioOutput, ResponseParams, too_long
from omnivoice.server.session.session_config import (
    FormatParam,
    SessionSettings,
    SettingsError,
    resolve_format,
    resolve_voice,
)
from omnivoice.server.session.tools import ToolsError, resolve_tools
from omnivoice.types import ModelInfo, text_exceeds


def plan_response(
    s: SessionSettings, stages: StagesConfig, info: ModelInfo, r: ResponseParams | None, event_id: str | None
) -> ResponsePlan:
    """The plan of a response from the session's settings `s`, the profile's `stages` sampling and
    the model's `info`, overridden by `response.create`'s `r` (ProtocolError if `r` is refused)."""
    r = r or ResponseParams()
    if r.input is not None:
        raise ProtocolError("response.input is not supported", "unsupported", "response.input", event_id)
    if r.prompt is not None:
        message = "response.prompt is not supported by this server (no stored prompts)"
        raise ProtocolError(message, "unsupported", "response.prompt", event_id)
    try:
        tools = resolve_tools(s.tools, r.tools, r.tool_choice, "response")
    except ToolsError as err:
        raise ProtocolError(str(err), "invalid_value", err.param, event_id) from None
    if r.instructions and text_exceeds([r.instructions], info.max_prompt_chars):
        raise too_long("response.instructions", len(r.instructions), info, event_id)
    if r.conversation not in (None, "auto", "none"):
        raise ProtocolError(
            "response.conversation must be 'auto' or 'none'",
            "invalid_value",
            "response.conversation",
            event_id,
        )
    out = r.audio.output if r.audio is not None and r.audio.output is not None else ResponseAudioOutput()
    voice = s.voice
    if out.voice or r.voice:
        try:
            voice = resolve_voice(
                out.voice or r.voice or "", info.voices, info.default_voice, "response.audio.output.voice"
            )
        except SettingsError as err:
            raise ProtocolError(str(err), "invalid_value", err.param, event_id) from None
    fmt, wanted = s.output_format, out.format if out.format is not None else r.output_audio_format
    if wanted is not None:
        fmt = resolve_format(_format_param(wanted, event_id), fmt)
    modalities: Sequence[str] = r.output_modalities or r.modalities or s.output_modalities
    tokens = r.max_output_tokens or r.max_response_output_tokens or s.max_output_tokens
    d = stages.thinker.sampling
    max_tokens = d.max_tokens if tokens in (None, "inf") else min(int(tokens), stages.thinker.max_seq_len)
    thinker = d.for_request(max_tokens=max_tokens, min_tokens=min(s.min_output_tokens or 0, max_tokens))
    t = stages.talker.sampling
    talker = t.for_request()
    if s.output_audio_frames:  # exactly that many frames, at most the profile's
        frames = min(s.output_audio_frames, t.max_tokens)
        talker = t.for_request(max_tokens=frames, min_tokens=frames)
    return ResponsePlan(
        voice=voice,
        output_format=fmt,
        want_audio="audio" in modalities,
        instructions=r.instructions if r.instructions is not None else s.instructions,
        thinker=thinker,
        talker=talker,
        in_conversation=r.conversation != "none",
        metadata=r.metadata,
        tools=tools,
    )


def _format_param(value: Any, event_id: str | None) -> FormatParam | str:
    if isinstance(value, str) and value in ("pcm16", "g711_ulaw", "g711_alaw"):
        return value
    try:
        return FormatParam.model_validate(value)
    except ValidationError:
        raise ProtocolError(
            "invalid audio output format", "invalid_value", "response.audio.output.format", event_id
        ) from None
