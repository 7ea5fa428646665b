"""A `session.update` checked against the served model: the settings it leads to, or a ProtocolError
naming the field, before any of it applies.

Beyond the settings' own rules (session_config.py): text no prompt could hold (the instructions, the
transcription prompt) is refused, and so are functions whose required call the grammar cannot
enforce (`check_tools`, also run for a response's own tools), when they are set rather than when a
turn needs them.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from omnivoice.engine.api import EngineAPI
from omnivoice.server.session import protocol as p
from omnivoice.server.session.session_config import SessionPatch, SessionSettings, SettingsError, apply_patch
from omnivoice.server.session.tools import SessionTools
from omnivoice.types import text_exceeds


def updated_settings(
    current: SessionSettings, session: dict[str, Any], engine: EngineAPI, event_id: str | None
) -> SessionSettings:
    """`current` with the `session.update` object `session` applied; ProtocolError if any of it is bad."""
    try:
        patch = SessionPatch.model_validate(session)
    except ValidationError as err:
        raise p.session_patch_error(err, event_id) from None
    info = engine.info
    if patch.instructions and text_exceeds([patch.instructions], info.max_prompt_chars):
        raise p.too_long("session.instructions", len(patch.instructions), info, event_id)
    asr = patch.audio.input.transcription if patch.audio and patch.audio.input else None
    asr = asr or patch.input_audio_transcription
    if asr is not None and asr.prompt and text_exceeds([asr.prompt], info.max_prompt_chars):
        raise p.too_long("session.audio.input.transcription.prompt", len(asr.prompt), info, event_id)
    try:
        new = apply_patch(current, patch, info.voices, info.default_voice)
    except SettingsError as err:
        raise p.ProtocolError(str(err), "invalid_value", err.param, event_id) from None
    if new.tools != current.tools:
        check_tools(engine, new.tools, "session.tools", event_id)
    return new


def check_tools(engine: EngineAPI, tools: SessionTools, param: str, event_id: str | None) -> None:
    """ProtocolError (invalid_schema, naming `param`) when the call `tools` require cannot be
    enforced: a function's parameters schema the grammar does not compile."""
    offered = tools.for_engine()
    try:
        if offered is not None:
            engine.check_tools(offered)
    except ValueError as err:
        raise p.ProtocolError(str(err), "invalid_schema", param, event_id) from None
