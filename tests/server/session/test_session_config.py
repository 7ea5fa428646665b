"""`session.update` payloads, GA and beta, into effective settings."""

from __future__ import annotations

import pytest

from omnivoice.server.session.session_config import (
    SEMANTIC_EAGERNESS,
    SessionPatch,
    SessionSettings,
    SettingsError,
    apply_patch,
)

VOICES = ("aiden", "chelsie", "ethan")


def update(settings: SessionSettings, patch: dict) -> SessionSettings:
    return apply_patch(settings, SessionPatch.model_validate(patch), VOICES, "ethan")


def test_ga_and_beta_shapes_give_the_same_settings() -> None:
    base = SessionSettings(voice="ethan")
    ga = update(base, {
        "type": "realtime", "output_modalities": ["text"], "max_output_tokens": 40,
        "instructions": "be brief",
        "audio": {"input": {"format": {"type": "audio/pcmu"}, "turn_detection": None},
                  "output": {"format": {"type": "audio/pcma"}, "voice": "Chelsie"}},
    })  # fmt: skip
    beta = update(base, {
        "modalities": ["text"], "max_response_output_tokens": 40, "instructions": "be brief",
        "input_audio_format": "g711_ulaw", "output_audio_format": "g711_alaw", "turn_detection": None,
        "voice": "chelsie",
    })  # fmt: skip
    assert ga == beta
    assert ga.input_format.sample_rate == 8000 and ga.voice == "chelsie" and ga.turn_detection is None
    assert ga.output_modalities == ("text",) and ga.max_output_tokens == 40


def test_turn_detection_and_semantic_vad_eagerness() -> None:
    s = SessionSettings(voice="ethan")
    assert (
        s.turn_detection is not None and s.turn_detection.silence_duration_ms == 500
    )  # server_vad by default
    s = update(s, {"audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 0.7,
                                                          "silence_duration_ms": 200}}}})  # fmt: skip
    assert s.turn_detection.threshold == 0.7 and s.turn_detection.prefix_padding_ms == 300
    for eagerness, rule in SEMANTIC_EAGERNESS.items():
        td = update(s, {"turn_detection": {"type": "semantic_vad", "eagerness": eagerness}}).turn_detection
        assert td.type == "semantic_vad" and td.semantic == rule
        assert td.silence_duration_ms == rule.ceiling_ms  # the ceiling: the longest a turn waits
        wire = {"type": "semantic_vad", "eagerness": eagerness}
        assert td.wire() == {**wire, "create_response": True, "interrupt_response": True}
    assert s.turn_detection.semantic is None  # server_vad: no end-of-turn model
    assert update(s, {"instructions": "x"}).turn_detection == s.turn_detection  # untouched when absent


def test_eagerness_moves_the_ceiling_and_the_bar() -> None:
    low, medium, high = (SEMANTIC_EAGERNESS[e] for e in ("low", "medium", "high"))
    assert low.ceiling_ms > medium.ceiling_ms > high.ceiling_ms  # low waits longest
    assert low.done >= medium.done >= high.done  # and wants the surest "done"
    assert SEMANTIC_EAGERNESS["auto"] == medium
    s = SessionSettings(voice="ethan")
    td = update(s, {"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}}).turn_detection
    assert td.eagerness == "auto" and td.semantic == medium


@pytest.mark.parametrize(
    ("patch", "param"),
    [
        ({"audio": {"input": {"turn_detection": {"type": "semantic_vad", "silence_duration_ms": 300}}}},
         "session.audio.input.turn_detection.silence_duration_ms"),
        ({"turn_detection": {"type": "semantic_vad", "eagerness": "low", "threshold": 0.6}},
         "session.turn_detection.threshold"),
        ({"turn_detection": {"type": "server_vad", "eagerness": "high"}}, "session.turn_detection.eagerness"),
    ],
)  # fmt: skip
def test_a_setting_of_the_other_turn_detection_is_refused(patch: dict, param: str) -> None:
    s = SessionSettings(voice="ethan")
    with pytest.raises(SettingsError) as e:
        update(s, patch)
    assert e.value.param == param


def test_settings_sent_as_null_are_left_out_and_bad_eagerness_fails() -> None:
    s = SessionSettings(voice="ethan")
    td = {"type": "semantic_vad", "eagerness": "high", "threshold": None, "silence_duration_ms": None}
    assert update(s, {"turn_detection": td}).turn_detection.semantic == SEMANTIC_EAGERNESS["high"]
    with pytest.raises(ValueError):  # pydantic's ValidationError: the protocol layer's invalid_value
        update(s, {"turn_detection": {"type": "semantic_vad", "eagerness": "eager"}})


def test_openai_voices_map_to_the_default_and_unknown_voices_fail() -> None:
    s = SessionSettings(voice="aiden")
    assert update(s, {"voice": "alloy"}).voice == "ethan"
    with pytest.raises(SettingsError) as e:
        update(s, {"audio": {"output": {"voice": "nobody"}}})
    assert e.value.param == "session.audio.output.voice"
    with pytest.raises(SettingsError):
        update(s, {"tool_choice": {"type": "function", "name": "f"}})  # no such function
    assert update(s, {"max_output_tokens": "inf"}).max_output_tokens is None


def test_the_extension_turns_the_speculative_response_off_and_on() -> None:
    s = SessionSettings(voice="ethan", speculative_response=False)  # the profile's choice
    assert update(s, {"omnivoice": {"output_audio_frames": 8}}).speculative_response is False  # unset: kept
    on = update(s, {"omnivoice": {"speculative_response": True}})
    assert on.speculative_response is True
    assert update(on, {"omnivoice": {"speculative_response": False}}).speculative_response is False
    with pytest.raises(ValueError, match="speculative"):
        SessionPatch.model_validate({"omnivoice": {"speculative": True}})  # unknown keys are named


def test_transcription_ga_and_beta_set_and_clear() -> None:
    s = SessionSettings(voice="ethan")
    assert s.transcription is None  # off unless asked for
    ga = update(s, {"audio": {"input": {"transcription": {"model": "whisper-1", "language": "en"}}}})
    beta = update(s, {"input_audio_transcription": {"model": "whisper-1", "language": "en"}})
    assert ga == beta and ga.transcription is not None
    assert ga.transcription.wire() == {"model": "whisper-1", "language": "en", "prompt": ""}
    assert update(ga, {"instructions": "x"}).transcription == ga.transcription  # untouched when absent
    assert update(ga, {"audio": {"input": {"transcription": None}}}).transcription is None
    assert update(ga, {"input_audio_transcription": None}).transcription is None
    with pytest.raises(ValueError, match="nonsense"):
        update(s, {"audio": {"input": {"transcription": {"model": "x", "nonsense": 1}}}})


def test_tools_and_tool_choice() -> None:
    s = SessionSettings(voice="ethan")
    f = {"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}}
    s = update(s, {"tools": [f], "tool_choice": {"type": "function", "name": "f"}})
    assert s.tools.choice == "required" and s.tools.function == "f"
    assert [t.name for t in s.tools.offered] == ["f"]
    assert s.tools.wire_tools() == [f] and s.tools.wire_choice() == {"type": "function", "name": "f"}
    assert update(s, {"instructions": "x"}).tools == s.tools  # untouched when absent
    none = update(s, {"tool_choice": "none"})
    assert none.tools.offered == () and none.tools.wire_choice() == "none" and none.tools.functions
    with pytest.raises(SettingsError) as e:
        update(s, {"tools": []})  # the named function would be gone
    assert e.value.param == "session.tool_choice.name"
    with pytest.raises(SettingsError) as e:
        update(SessionSettings(voice="ethan"), {"tool_choice": "required"})
    assert e.value.param == "session.tool_choice"
    with pytest.raises(ValueError, match="object"):
        update(s, {"tools": [{**f, "parameters": {"type": "string"}}]})
