"""Fuzz the audio decoders (`decode_wav`, `decode_base64_audio`, the realtime wire formats): WAVs
with truncated or lying headers, odd byte counts, zero channels, huge rates, every sample size, float
and non-PCM tags, non-audio bytes, broken and huge base64. The contract: mono float32 samples in
[-1, 1] at a sane rate, or an `AudioDecodeError` (a 400 / an `error` event), never anything else.
"""

from __future__ import annotations

import struct

import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

from omnivoice.audio import AudioDecodeError, decode_base64_audio, decode_wav, encode_wav
from omnivoice.audio.formats import FORMATS
from tests.support.fuzz_inputs.strategies import b64, lying_base64
from tests.support.fuzz_inputs.wav import U32, wav_files


def _valid_output(pcm: np.ndarray, rate: int, n_bytes: int) -> None:
    assert pcm.dtype == np.float32 and pcm.ndim == 1
    assert pcm.size <= n_bytes  # at least one byte per sample: no header can inflate the output
    assert np.isfinite(pcm).all() and (np.abs(pcm) <= 1.0).all()
    assert 1000 <= rate <= 768_000


def _wav_header(
    tag: int, channels: int, rate: int, bits: int, data: bytes, data_size: int | None = None
) -> bytes:
    block = channels * bits // 8 & 0xFFFF
    fmt = struct.pack("<HHIIHH", tag, channels, rate, rate * block & U32, block, bits)
    size = len(data) if data_size is None else data_size
    chunks = b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", size) + data
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks


@given(wav_files())
@example(_wav_header(1, 0, 16000, 16, b"\x00" * 10))  # zero channels
@example(_wav_header(1, 1, U32, 16, b"\x00" * 10))  # a huge rate
@example(_wav_header(1, 1, 16000, 16, b"\x00" * 11, data_size=U32))  # data size past the end, odd bytes
@example(_wav_header(1, 3, 16000, 24, b"\x01" * 17))  # 24-bit, 3 channels, a partial frame
@example(_wav_header(3, 1, 16000, 32, struct.pack("<4f", np.nan, np.inf, -np.inf, 1e30)))  # float junk
@example(_wav_header(3, 1, 16000, 64, struct.pack("<2d", 1e300, -1e300)))  # doubles past float32
@example(_wav_header(0x55, 1, 16000, 16, b"\x00" * 10))  # MP3 in a WAV
@example(_wav_header(1, 1, 16000, 8, b""))  # no samples
def test_decode_wav_returns_audio_or_a_decode_error(data: bytes) -> None:
    try:
        pcm, rate = decode_wav(data)
    except AudioDecodeError as e:
        assert str(e)
        return
    _valid_output(pcm, rate, len(data))


@given(st.binary(max_size=2000) | st.text(max_size=200).map(lambda s: s.encode("utf-8", "surrogatepass")))
@example(b"RIFF")
@example(b"RIFF\xff\xff\xff\xffWAVE")
def test_non_audio_bytes_are_a_decode_error(data: bytes) -> None:
    try:
        pcm, rate = decode_wav(data)
    except AudioDecodeError:
        return
    _valid_output(pcm, rate, len(data))


@given(lying_base64(wav_files()), st.sampled_from(["wav", "pcm16", "WAV", "mp3", "", "flac"]))
@example(b64(encode_wav(np.zeros(100, np.float32), 16000)), "wav")
@example("\ud800", "wav")  # not ASCII, not even UTF-8
@example("data:audio/wav;base64", "wav")  # a data URL without its comma
@example("AAA", "pcm16")  # an odd byte count after decoding
def test_decode_base64_audio_returns_audio_or_a_decode_error(data: str, fmt: str) -> None:
    try:
        pcm, rate = decode_base64_audio(data, fmt)
    except AudioDecodeError as e:
        assert str(e)
        return
    _valid_output(pcm, rate, len(data))


@given(st.sampled_from(sorted(FORMATS)), st.binary(max_size=3000))
@example("pcm16", b"\x01")
def test_realtime_wire_formats_decode_or_refuse(name: str, data: bytes) -> None:
    fmt = FORMATS[name]
    try:
        pcm = fmt.decode(data)
    except AudioDecodeError:
        assert name == "pcm16" and len(data) % 2
        return
    assert pcm.dtype == np.float32 and pcm.size == len(data) // fmt.bytes_per_sample
    assert np.isfinite(pcm).all() and (np.abs(pcm) <= 1.0).all()
    assert len(fmt.encode(pcm)) == pcm.size * fmt.bytes_per_sample
