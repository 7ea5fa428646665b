"""G.711 u-law and A-law codecs (ITU-T G.711), vectorized with numpy.

The bit manipulations follow the reference implementation (Sun's g711.c, also what `audioop` did):
16-bit linear PCM in, one byte per sample out, and back. Telephony audio is 8 kHz; resampling is the
caller's business.
"""

from __future__ import annotations

import numpy as np

_ULAW_BIAS = 0x84  # decode works on 16-bit values
_ULAW_CLIP = 8159  # encode works on 14-bit values, with the bias >> 2
_ULAW_SEG_END = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF], dtype=np.int32)
_ALAW_SEG_END = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF], dtype=np.int32)


def ulaw_encode(pcm16: np.ndarray) -> bytes:
    """int16 samples -> u-law bytes (on the 14-bit magnitude, as the reference code does)."""
    x = np.asarray(pcm16, dtype=np.int32) >> 2
    mask = np.where(x < 0, 0x7F, 0xFF)
    mag = np.minimum(np.abs(x), _ULAW_CLIP) + (_ULAW_BIAS >> 2)  # [33, 8192]
    seg = np.searchsorted(_ULAW_SEG_END, mag, side="left").astype(np.int32)
    uval = np.where(seg >= 8, 0x7F, (np.minimum(seg, 7) << 4) | ((mag >> (seg + 1)) & 0x0F))
    return ((uval ^ mask) & 0xFF).astype(np.uint8).tobytes()


def ulaw_decode(data: bytes) -> np.ndarray:
    """u-law bytes -> int16 samples."""
    u = ~np.frombuffer(data, dtype=np.uint8).astype(np.int32) & 0xFF
    exponent = (u >> 4) & 0x07
    mag = (((u & 0x0F) << 3) + _ULAW_BIAS) << exponent
    mag -= _ULAW_BIAS
    return np.where(u & 0x80, -mag, mag).astype(np.int16)


def alaw_encode(pcm16: np.ndarray) -> bytes:
    """int16 samples -> A-law bytes."""
    x = np.asarray(pcm16, dtype=np.int32) >> 3  # 13-bit
    negative = x < 0
    mask = np.where(negative, 0x55, 0xD5)
    mag = np.where(negative, -x - 1, x)
    seg = np.searchsorted(_ALAW_SEG_END, mag, side="left").astype(np.int32)  # first seg with mag <= end
    shift = np.where(seg < 2, 1, seg)
    aval = (np.minimum(seg, 7) << 4) | ((mag >> shift) & 0x0F)
    aval = np.where(seg >= 8, 0x7F, aval)
    return ((aval ^ mask) & 0xFF).astype(np.uint8).tobytes()


def alaw_decode(data: bytes) -> np.ndarray:
    """A-law bytes -> int16 samples."""
    a = np.frombuffer(data, dtype=np.uint8).astype(np.int32) ^ 0x55
    t = (a & 0x0F) << 4
    seg = (a & 0x70) >> 4
    t = np.where(seg == 0, t + 8, (t + 0x108) << np.maximum(seg - 1, 0))
    return np.where(a & 0x80, t, -t).astype(np.int16)
