"""A call's `customParameters` (the TwiML's <Parameter>s) as the session settings they choose."""

from __future__ import annotations

from omnivoice.server.session.session_config import SessionPatch
from omnivoice.server.telephony.twilio_call import CallParameters


def test_custom_parameters_choose_the_speculative_response() -> None:
    params, problems = CallParameters.parse({"speculative_response": "false", "silence_duration_ms": "400"})
    update = params.session_update()
    assert problems == [] and update["omnivoice"]["speculative_response"] is False
    assert SessionPatch.model_validate(update).omnivoice.speculative_response is False  # type: ignore[union-attr]
    assert "omnivoice" not in CallParameters.parse({})[0].session_update()  # the profile's choice
    _, problems = CallParameters.parse({"speculative_response": "sometimes"})
    assert problems and problems[0].startswith("speculative_response")


def test_custom_parameters_choose_semantic_vad_and_its_eagerness() -> None:
    raw = {"turn_detection": "semantic_vad", "eagerness": "high", "silence_duration_ms": "400"}
    params, problems = CallParameters.parse(raw)
    td = params.session_update()["audio"]["input"]["turn_detection"]
    assert not problems
    # semantic VAD takes no silence window: the server_vad setting is left out, not refused
    barge_in = {"create_response": True, "interrupt_response": True}
    assert td == {"type": "semantic_vad", "eagerness": "high", **barge_in}
    update = CallParameters.parse({"eagerness": "high"})[0].session_update()
    server = update["audio"]["input"]["turn_detection"]
    assert server["type"] == "server_vad" and "eagerness" not in server
    _, problems = CallParameters.parse({"turn_detection": "psychic_vad", "eagerness": "eager"})
    assert len(problems) == 2 and {p.split(":")[0] for p in problems} == {"turn_detection", "eagerness"}
