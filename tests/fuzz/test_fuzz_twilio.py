"""Fuzz Twilio Media Streams frames: the parser, the media payload check, the call's custom
parameters, and a whole `TwilioCall` over the fake engine. Frames are Twilio's documented messages
with fields dropped, retyped or added, wrong event names, bad base64 payloads, wrong sequence numbers
and stream ids, marks never sent, and raw garbage. The contract: a malformed frame is counted and
dropped (`TwilioProtocolError`), never another exception (which would hang up the call), and the
call goes on taking audio.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from omnivoice.audio.vad import SileroVad
from omnivoice.config import parse_profile
from omnivoice.server.auth.keys import ANONYMOUS
from omnivoice.server.auth.limits import KeyLimits
from omnivoice.server.session.registry import Sessions
from omnivoice.server.session.session_config import SessionPatch
from omnivoice.server.telephony import twilio_protocol as tw
from omnivoice.server.telephony.twilio_call import CallParameters, TwilioCall
from tests.support.fake_engine import AlwaysAdmit, FakeEngine, Script, fake_model_info
from tests.support.fuzz_inputs.twilio import CONNECTED, MEDIA, START, frames


@given(frames)
@example(json.dumps({**MEDIA, "media": {"payload": "\ud800"}}))  # not ASCII
@example(json.dumps({**MEDIA, "media": {"payload": "A" * 4_000_000}}))  # huge
@example(json.dumps({"event": ["media"]}))  # an unhashable event name
@example(b'{"event": "media"}')  # a binary frame
@example(json.dumps({**START, "start": {**START["start"], "customParameters": {"instructions": "\ud800"}}}))
def test_a_frame_parses_or_is_a_protocol_error(frame: str | bytes) -> None:
    try:
        event = tw.parse_event(frame)
        if isinstance(event, tw.Media):
            assert 0 < len(tw.media_payload(event)) <= tw.MAX_PAYLOAD_BYTES
        if isinstance(event, tw.Start):  # the instructions reach the tokenizer: valid Unicode only
            json.dumps(event.start.custom_parameters, ensure_ascii=False).encode("utf-8")
    except tw.TwilioProtocolError as e:
        assert str(e)


@given(st.dictionaries(st.sampled_from([*START["start"]["customParameters"], "x"]) | st.text(), st.text()))
@example({"silence_duration_ms": "-1", "max_output_tokens": "1e999", "voice": "\ud800"})
def test_custom_parameters_keep_the_valid_ones(raw: dict[str, str]) -> None:
    params, problems = CallParameters.parse(raw)
    assert all(isinstance(p, str) for p in problems)
    SessionPatch.model_validate(params.session_update())  # what the call applies is a valid patch


# ---- a whole call ----------------------------------------------------------------------------------
PROFILE = parse_profile({"realtime": {"max_buffer_seconds": 3.0}})


class _Carrier:
    """The call's WebSocket: what the server sends is recorded."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    async def send_text(self, text: str) -> None:
        self.sent.append(text)


@pytest.fixture(scope="module")
def vad() -> Iterator[SileroVad]:
    yield SileroVad()


async def _run_call(vad: SileroVad, messages: list[str | bytes]) -> TwilioCall:
    engine = FakeEngine(fake_model_info("omnivoice"), Script(delay=0.0, audio_chunks=2))
    lifecycle = SimpleNamespace(require=lambda: engine)
    sessions = Sessions(PROFILE, lifecycle, AlwaysAdmit(), KeyLimits(PROFILE.auth.rate_limit), vad)
    call = TwilioCall(_Carrier(), await sessions.admit(ANONYMOUS), PROFILE)  # type: ignore[arg-type]
    try:
        for message in [json.dumps(CONNECTED), *messages]:
            if not await call.handle(message):
                return call  # a valid stop
        if call.session is None:
            assert await call.handle(json.dumps({**START, "streamSid": "MZ_late", "start": {
                **START["start"], "streamSid": "MZ_late"}}))  # fmt: skip
        malformed = call.malformed
        payload = base64.b64encode(b"\xff" * 1600).decode()  # 200 ms: more than the resampler holds back
        media = {**MEDIA, "streamSid": call.stream_sid, "media": {**MEDIA["media"], "payload": payload}}
        assert await call.handle(json.dumps(media)) and call.malformed == malformed  # still takes audio
        assert call.session is not None and call.session.buffer.end > 0
    finally:
        await call.close()
    return call


@given(st.lists(frames, max_size=6), st.booleans())
@example([json.dumps({**START, "start": {**START["start"], "customParameters": {"voice": 5}}})], True)
@example([json.dumps({**MEDIA, "media": {**MEDIA["media"], "payload": "AA=="}})], True)
def test_a_call_drops_bad_frames_and_goes_on(vad: SileroVad, messages: list, started: bool) -> None:
    if started:
        messages = [json.dumps(START), *messages]
    asyncio.run(_run_call(vad, messages))
