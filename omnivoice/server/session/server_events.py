"""Server events and the objects they carry (session, response, usage), in the GA shapes.

The outbox renames events for beta clients; the session object has a beta shape of its own.
"""

from __future__ import annotations

from typing import Any

from omnivoice.audio.formats import AudioFormat
from omnivoice.server.session.session_config import SessionSettings
from omnivoice.types import Usage

Event = dict[str, Any]


def error(
    message: str,
    code: str,
    param: str | None = None,
    event_id: str | None = None,
    type_: str = "invalid_request_error",
) -> Event:
    body = {"type": type_, "code": code, "message": message, "param": param, "event_id": event_id}
    return {"type": "error", "error": body}


def format_object(fmt: AudioFormat) -> dict[str, Any]:
    return {"type": fmt.mime, "rate": fmt.sample_rate} if fmt.name == "pcm16" else {"type": fmt.mime}


def session_object(s: SessionSettings, session_id: str, model: str, beta: bool) -> dict[str, Any]:
    td = s.turn_detection.wire() if s.turn_detection else None
    tokens: int | str = s.max_output_tokens or "inf"
    transcription = s.transcription.wire() if s.transcription else None
    if beta:
        return {
            "id": session_id,
            "object": "realtime.session",
            "model": model,
            "modalities": ["text", "audio"] if "audio" in s.output_modalities else ["text"],
            "instructions": s.instructions or "",
            "voice": s.voice,
            "input_audio_format": s.input_format.name,
            "output_audio_format": s.output_format.name,
            "input_audio_transcription": transcription,
            "turn_detection": td,
            "tools": s.tools.wire_tools(),
            "tool_choice": s.tools.wire_choice(),
            "temperature": s.echo.get("temperature") or 0.8,
            "max_response_output_tokens": tokens,
        }
    return {
        "type": "realtime",
        "object": "realtime.session",
        "id": session_id,
        "model": model,
        "output_modalities": list(s.output_modalities),
        "instructions": s.instructions or "",
        "audio": {
            "input": {
                "format": format_object(s.input_format),
                "transcription": transcription,
                "noise_reduction": None,
                "turn_detection": td,
            },
            "output": {"format": format_object(s.output_format), "voice": s.voice, "speed": 1.0},
        },
        "tools": s.tools.wire_tools(),
        "tool_choice": s.tools.wire_choice(),
        "max_output_tokens": tokens,
        "tracing": s.echo.get("tracing"),
        "truncation": s.echo.get("truncation") or "auto",
        "prompt": s.echo.get("prompt"),
        "include": s.echo.get("include"),
        "expires_at": 0,
    }


def usage_object(usage: Usage | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    return {
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "input_tokens": usage.prompt_tokens,
        "output_tokens": usage.completion_tokens,
        "input_token_details": {"cached_tokens": usage.cached_tokens},
        "output_token_details": {"text_tokens": usage.completion_tokens, "audio_tokens": usage.audio_frames},
    }
