"""WAV files for the fuzz tests: a RIFF/WAVE file built field by field (chunk sizes, format tag,
channels, rate, sample size), any field of which may lie, then maybe truncated.
"""

from __future__ import annotations

import struct

from hypothesis import strategies as st

U32 = 2**32 - 1
TAGS = [0x0001, 0x0003, 0xFFFE, 0x0000, 0x0002, 0x0006, 0x0055, 0xFFFF]
BITS = [0, 1, 4, 8, 12, 16, 20, 24, 32, 48, 64, 65535]
RATES = [0, 1, 999, 1000, 8000, 16000, 24000, 44100, 768_000, 768_001, U32]
CHANNELS = [0, 1, 2, 3, 6, 64, 65, 65535]


def _chunk(draw: st.DrawFn, chunk_id: bytes, body: bytes) -> bytes:
    """A chunk whose size field is usually true, sometimes a lie (0, huge, off by some)."""
    size = draw(
        st.sampled_from([len(body)] * 4 + [0, U32, len(body) + 1, max(0, len(body) - 1)])
        | st.integers(0, U32)
    )
    pad = b"\x00" if len(body) % 2 and draw(st.booleans()) else b""
    return chunk_id + struct.pack("<I", size) + body + pad


@st.composite
def fmt_bodies(draw: st.DrawFn) -> bytes:
    tag = draw(st.sampled_from(TAGS) | st.integers(0, 0xFFFF))
    channels = draw(st.sampled_from(CHANNELS) | st.integers(0, 0xFFFF))
    rate = draw(st.sampled_from(RATES) | st.integers(0, U32))
    bits = draw(st.sampled_from(BITS) | st.integers(0, 0xFFFF))
    block = draw(st.sampled_from([channels * bits // 8 & 0xFFFF, 0, 0xFFFF]))
    body = struct.pack("<HHIIHH", tag, channels, rate, rate * block & U32, block, bits)
    if tag == 0xFFFE or draw(st.booleans()):  # cbSize, valid bits, channel mask, SubFormat GUID
        sub = draw(st.sampled_from([0x0001, 0x0003, 0x0055]) | st.integers(0, 0xFFFF))
        body += struct.pack("<HHI", 22, bits, 0) + struct.pack("<H", sub) + b"\x00\x00\x00\x00\x10\x00"
        body += b"\x80\x00\x00\xaa\x00\x38\x9b\x71"
    return body[: draw(st.sampled_from([len(body)] * 6 + [0, 8, 15, 16, 24, 25]))]


@st.composite
def wav_files(draw: st.DrawFn) -> bytes:
    """A RIFF/WAVE file built field by field, any of which may lie, then maybe truncated."""
    chunks = []
    if draw(st.booleans()):
        kind = draw(st.sampled_from([b"LIST", b"fact", b"JUNK", b"bext"]))
        chunks.append(_chunk(draw, kind, draw(st.binary(max_size=9))))
    fmt = _chunk(draw, b"fmt ", draw(fmt_bodies()))
    data = _chunk(draw, b"data", draw(st.binary(max_size=600)))
    chunks += draw(st.sampled_from([[fmt, data], [fmt, data], [data, fmt], [fmt], [data], [fmt, fmt, data]]))
    body = draw(st.sampled_from([b"WAVE"] * 5 + [b"WAVX", b"AVI "])) + b"".join(chunks)
    magic = draw(st.sampled_from([b"RIFF"] * 5 + [b"RF64", b"RIFX", b"RIFF\x00"[:4], b"OggS"]))
    riff_size = draw(st.sampled_from([len(body)] * 3 + [0, U32]) | st.integers(0, U32))
    data_bytes = magic + struct.pack("<I", riff_size) + body
    return data_bytes[: draw(st.sampled_from([len(data_bytes)] * 4 + [0, 4, 11, 12, 20, 36, 44]))]
