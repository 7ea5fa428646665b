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
