"""WebRTC offers for the fuzz tests: a real aiortc offer (made once, on import) with lines deleted,
duplicated, swapped, cut, retyped or injected, and random text after `v=0`.
"""

from __future__ import annotations

import asyncio

from aiortc import RTCConfiguration, RTCPeerConnection
from hypothesis import strategies as st

from .strategies import EDGE_STRINGS, pick, raw_text


async def _offer() -> str:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("audio")
    pc.createDataChannel("oai-events")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp


OFFER = asyncio.run(_offer())
LINES = OFFER.split("\r\n")
TOKENS = ["", "-1", "0", "65536", "99999999999999999999", "abc", "é", "\x00", "IN", "IP6", "::1", "/", ":"]
INJECTED = [
    "m=audio 9 UDP/TLS/RTP/SAVPF 0",
    "m=video 9 UDP/TLS/RTP/SAVPF 96",
    "m=application 9 UDP/DTLS/SCTP webrtc-datachannel",
    "a=rtpmap:111 opus/48000/2",
    "a=rtpmap:111",
    "a=fmtp:111 x",
    "a=candidate:1 1 UDP 1 1.2.3.4 9 typ host",
    "a=candidate:garbage",
    "a=fingerprint:sha-256 00",
    "a=fingerprint:md5 AB:CD",
    "a=setup:holdconn",
    "a=ice-ufrag:",
    "a=mid:",
    "a=group:BUNDLE 7",
    "a=sctp-port:x",
    "a=msid-semantic:",
    "c=IN IP4",
    "o=- x x IN IP4",
    "t=",
    "x",
]


@st.composite
def mutated_offers(draw: st.DrawFn) -> str:
    lines = list(LINES)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(lines) - 1))
        how = draw(st.sampled_from(["delete", "duplicate", "swap", "retype", "inject", "cut"]))
        if how == "delete" and len(lines) > 1:
            del lines[at]
        elif how == "duplicate":
            lines.insert(at, lines[at])
        elif how == "swap":
            other = draw(st.integers(0, len(lines) - 1))
            lines[at], lines[other] = lines[other], lines[at]
        elif how == "retype":  # one token of the line: the value after '=' split on spaces and colons
            parts = lines[at].replace(":", " ").split(" ")
            parts[draw(st.integers(0, len(parts) - 1))] = draw(st.sampled_from(TOKENS) | st.text(max_size=5))
            lines[at] = " ".join(parts) if "=" in parts[0] else lines[at][:2] + " ".join(parts)
        elif how == "inject":
            lines.insert(at, draw(st.sampled_from(INJECTED)))
        elif how == "cut":
            lines[at] = lines[at][: draw(st.integers(0, len(lines[at])))]
    newline = draw(st.sampled_from(["\r\n", "\r\n", "\n", "\r"]))
    return newline.join(lines)


sdp_texts = pick(
    mutated_offers(),
    mutated_offers(),
    mutated_offers(),
    raw_text.map(lambda t: "v=0\r\n" + t),
    st.lists(st.sampled_from(INJECTED + EDGE_STRINGS), max_size=8).map(lambda ls: "\r\n".join(["v=0", *ls])),
)
