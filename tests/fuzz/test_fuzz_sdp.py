"""Fuzz WebRTC offers: a real aiortc offer with lines deleted, duplicated, swapped, cut or retyped,
and random text, through `Call.answer` (what `POST /v1/realtime/calls` runs). The contract: an SDP
answer, or an `OfferError` (a 400 `invalid_offer`), never another exception, and the peer
connection is closed either way.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import example, given

from omnivoice.server.webrtc.channel import DataChannelOutbox
from omnivoice.server.webrtc.peer import Call, OfferError
from tests.support.fuzz_inputs.sdp import LINES, OFFER, sdp_texts


class _Session:
    """As much of a session as answering an offer needs."""

    id = "sess_fuzz"

    async def close(self) -> None:
        pass


async def _answer(sdp: str) -> str | OfferError:
    call = Call("rtc_fuzz", _Session(), DataChannelOutbox("sess_fuzz"))  # type: ignore[arg-type]
    try:
        return await asyncio.wait_for(call.answer(sdp), 10)
    except OfferError as e:
        return e
    finally:
        await call.close()


@given(sdp_texts)
@example(OFFER)
@example(OFFER.replace("a=setup:actpass", "a=setup:holdconn"))  # KeyError in aiortc's parser
@example(OFFER.replace("\r\n", "\r"))  # IndexError, StopIteration (as RuntimeError)
@example("\r\n".join(line for line in LINES if not line.startswith("m=audio")))  # AttributeError
@example("\r\n".join(line for line in LINES if not line.startswith("a=fingerprint")))
@example("\r\n".join(line for line in LINES if not line.startswith("a=ice-ufrag")))
@example("v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n")
# no codec lines at all: aiortc's OperationError
@example("\r\n".join(x for x in LINES if not x.startswith(("a=rtpmap", "a=fmtp", "a=rtcp-fb"))))
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # aiortc's transports, closed before they started
def test_an_offer_is_answered_or_refused(sdp: str) -> None:
    result = asyncio.run(_answer(sdp))
    if isinstance(result, OfferError):
        assert str(result)
    else:
        assert result.startswith("v=0") and "m=audio" in result
