"""WAV and raw PCM16 codecs, numpy + stdlib only.

Decoding parses the RIFF chunks by hand rather than with `wave`, because `wave` rejects float and
WAVE_FORMAT_EXTENSIBLE files and trusts the header's sizes. Real uploads lie: streaming writers put
0 or 0xFFFFFFFF in the data size, truncated files claim more bytes than they hold, block_align is
sometimes wrong. We trust only format tag, channels, rate and bits per sample, and clamp the data
chunk to the bytes actually present (dropping a trailing partial frame).
"""

from __future__ import annotations

import base64
import binascii
import struct
from dataclasses import dataclass

import numpy as np

PCM16_SAMPLE_RATE = 24000  # `format: "pcm16"` input is raw 16-bit mono little-endian at this rate

_WAVE_FORMAT_PCM = 0x0001
_WAVE_FORMAT_IEEE_FLOAT = 0x0003
_WAVE_FORMAT_EXTENSIBLE = 0xFFFE
_MAX_CHANNELS = 64
_MIN_RATE, _MAX_RATE = 1000, 768_000


class AudioDecodeError(ValueError):
    """Audio bytes that cannot be decoded; the message is safe to show to the client."""


@dataclass(frozen=True)
class _Format:
    tag: int  # _WAVE_FORMAT_PCM or _WAVE_FORMAT_IEEE_FLOAT (extensible is resolved to its subformat)
    channels: int
    rate: int
    bits: int


def decode_wav(data: bytes) -> tuple[np.ndarray, int]:
    """Decode a WAV file to mono float32 PCM in [-1, 1] and its sample rate.

    Accepts 8/16/24/32-bit integer PCM and 32/64-bit float, plain or WAVE_FORMAT_EXTENSIBLE,
    any channel count (averaged to mono) and any rate in [1 kHz, 768 kHz].
    """
    view = memoryview(data)
    if len(view) < 12:
        raise AudioDecodeError(f"not a WAV file: only {len(view)} bytes")
    magic, form = bytes(view[:4]), bytes(view[8:12])
    if magic == b"RIFX":
        raise AudioDecodeError("big-endian WAV (RIFX) is not supported")
    if magic not in (b"RIFF", b"RF64") or form != b"WAVE":
        raise AudioDecodeError("not a WAV file: missing RIFF/WAVE header")
    fmt, payload = _read_chunks(view)
    samples = _to_float(payload, fmt)  # [frames, channels]
    mono = samples[:, 0] if fmt.channels == 1 else samples.mean(axis=1)
    return np.ascontiguousarray(mono, dtype=np.float32), fmt.rate


def _read_chunks(view: memoryview) -> tuple[_Format, memoryview]:
    pos, fmt = 12, None
    while pos + 8 <= len(view):
        chunk_id = bytes(view[pos : pos + 4])
        size = int.from_bytes(view[pos + 4 : pos + 8], "little")
        start = pos + 8
        left = len(view) - start
        if chunk_id == b"data":
            if fmt is None:
                raise AudioDecodeError("invalid WAV: data chunk comes before the fmt chunk")
            if size == 0 or size > left:  # streaming writer or truncated file: take what is there
                size = left
            return fmt, view[start : start + size]
        if size > left:
            name = chunk_id.decode("latin-1")
            raise AudioDecodeError(f"truncated WAV: {name!r} chunk claims {size} bytes, {left} left")
        if chunk_id == b"fmt ":
            fmt = _parse_fmt(view[start : start + size])
        pos = start + size + (size & 1)  # chunks are padded to an even size
    if fmt is None:
        raise AudioDecodeError("invalid WAV: no fmt chunk")
    raise AudioDecodeError("invalid WAV: no data chunk")


def _parse_fmt(body: memoryview) -> _Format:
    if len(body) < 16:
        raise AudioDecodeError(f"invalid WAV: fmt chunk has {len(body)} bytes, needs 16")
    tag, channels, rate, _byte_rate, _block_align, bits = struct.unpack_from("<HHIIHH", body)
    if tag == _WAVE_FORMAT_EXTENSIBLE:
        if len(body) < 26:
            raise AudioDecodeError("invalid WAV: extensible fmt chunk is too short")
        tag = int.from_bytes(body[24:26], "little")  # first two bytes of the SubFormat GUID
    if tag not in (_WAVE_FORMAT_PCM, _WAVE_FORMAT_IEEE_FLOAT):
        raise AudioDecodeError(f"unsupported WAV encoding (format tag {tag:#06x}); send integer PCM or float")
    if not 1 <= channels <= _MAX_CHANNELS:
        raise AudioDecodeError(f"invalid WAV: {channels} channels")
    if not _MIN_RATE <= rate <= _MAX_RATE:
        raise AudioDecodeError(f"unsupported WAV sample rate {rate} Hz (allowed {_MIN_RATE}-{_MAX_RATE})")
    allowed = (8, 16, 24, 32) if tag == _WAVE_FORMAT_PCM else (32, 64)
    if bits not in allowed:
        kind = "integer" if tag == _WAVE_FORMAT_PCM else "float"
        raise AudioDecodeError(f"unsupported WAV sample size: {bits}-bit {kind}")
    return _Format(tag, channels, rate, bits)


def _to_float(payload: memoryview, fmt: _Format) -> np.ndarray:
    width = fmt.bits // 8
    frames = len(payload) // (width * fmt.channels)  # a trailing partial frame is dropped
    raw = np.frombuffer(payload, dtype=np.uint8, count=frames * width * fmt.channels)
    if fmt.tag == _WAVE_FORMAT_IEEE_FLOAT:
        x = raw.view("<f4" if width == 4 else "<f8")  # clipped before the cast: doubles overflow float32
        x = np.clip(np.nan_to_num(x, nan=0.0, posinf=1.0, neginf=-1.0), -1.0, 1.0).astype(np.float32)
    elif width == 1:
        x = (raw.astype(np.float32) - 128.0) / 128.0  # 8-bit WAV is unsigned
    elif width == 2:
        x = raw.view("<i2").astype(np.float32) / 32768.0
    elif width == 3:
        b = raw.reshape(-1, 3).astype(np.int32)
        v = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        v = np.where(v >= 1 << 23, v - (1 << 24), v)  # sign-extend 24 -> 32 bits
        x = v.astype(np.float32) / float(1 << 23)
    else:
        x = (raw.view("<i4").astype(np.float64) / float(1 << 31)).astype(np.float32)
    return x.reshape(frames, fmt.channels)


def pcm16_bytes(pcm: np.ndarray) -> bytes:
    """Float PCM in [-1, 1] (clipped; NaN is silence) to 16-bit little-endian bytes. Few numpy calls:
    the event loop encodes every session's outgoing audio, and each call may wait for the GIL."""
    x = np.asarray(pcm, dtype=np.float32).reshape(-1)
    if not np.isfinite(x).all():
        x = np.nan_to_num(x, nan=0.0)
    y = np.clip(x, -1.0, 1.0) * 32767.0
    return np.rint(y, out=y).astype("<i2").tobytes()


def encode_wav(pcm: np.ndarray, sample_rate: int) -> bytes:
    """Mono float PCM to a complete 16-bit PCM WAV file."""
    body = pcm16_bytes(pcm)
    header = struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF", 36 + len(body), b"WAVE",
        b"fmt ", 16, _WAVE_FORMAT_PCM, 1, sample_rate, sample_rate * 2, 2, 16,
        b"data", len(body),
    )  # fmt: skip
    return header + body


def decode_pcm16(data: bytes) -> np.ndarray:
    """Raw 16-bit little-endian mono PCM to float32."""
    if len(data) % 2:
        raise AudioDecodeError(f"pcm16 audio must have an even number of bytes, got {len(data)}")
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def decode_base64_audio(data: str, audio_format: str) -> tuple[np.ndarray, int]:
    """Decode an OpenAI `input_audio` payload: base64 `wav`, or `pcm16` (raw mono 24 kHz)."""
    fmt = audio_format.lower()
    if fmt not in ("wav", "pcm16"):
        raise AudioDecodeError(
            f"unsupported input audio format {audio_format!r}; use 'wav' or 'pcm16' (raw 16-bit mono 24 kHz)"
        )
    raw = _b64decode(data)
    if fmt == "wav":
        return decode_wav(raw)
    return decode_pcm16(raw), PCM16_SAMPLE_RATE


def _b64decode(data: str) -> bytes:
    if data.startswith("data:"):  # some clients send a data URL where plain base64 is expected
        _, sep, data = data.partition(",")
        if not sep:
            raise AudioDecodeError("input audio data URL has no ',' before its payload")
    text = "".join(data.split()).replace("-", "+").replace("_", "/")  # line-wrapped or url-safe
    text += "=" * (-len(text) % 4)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise AudioDecodeError("input audio is not valid base64") from None
