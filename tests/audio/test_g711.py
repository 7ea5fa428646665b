"""G.711 against the reference implementation (`audioop`, where this Python still has it) and round trips."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from omnivoice.audio.formats import FORMATS
from omnivoice.audio.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode

ALL_INT16 = np.arange(-32768, 32768, dtype=np.int16)


def test_matches_audioop_bit_for_bit() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        audioop = pytest.importorskip("audioop")
    raw = ALL_INT16.tobytes()
    assert ulaw_encode(ALL_INT16) == audioop.lin2ulaw(raw, 2)
    assert alaw_encode(ALL_INT16) == audioop.lin2alaw(raw, 2)
    codes = bytes(range(256))
    assert ulaw_decode(codes).tobytes() == audioop.ulaw2lin(codes, 2)
    assert alaw_decode(codes).tobytes() == audioop.alaw2lin(codes, 2)


@pytest.mark.parametrize("name", ["g711_ulaw", "g711_alaw"])
def test_round_trip_error_is_logarithmic(name: str) -> None:
    fmt = FORMATS[name]
    x = np.sin(2 * np.pi * 440 * np.arange(8000) / 8000).astype(np.float32) * 0.5
    data = fmt.encode(x)
    assert len(data) == x.size and fmt.seconds(len(data)) == 1.0
    back = fmt.decode(data)
    assert back.dtype == np.float32 and np.abs(back - x).max() <= 0.5 * 2**-5  # at most ~3% of the level
    assert fmt.encode(back) == data  # decoding then encoding is lossless


def test_pcm16_format_rejects_odd_byte_counts() -> None:
    with pytest.raises(ValueError, match="even number of bytes"):
        FORMATS["pcm16"].decode(b"\x00\x01\x02")
