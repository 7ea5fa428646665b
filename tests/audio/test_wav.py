"""omnivoice.audio.wav: decoding real-world WAVs (incl. lying headers) and encoding."""

from __future__ import annotations

import base64
import io
import struct
import wave

import numpy as np
import pytest
import soundfile as sf

from omnivoice.audio import (
    AudioDecodeError,
    decode_base64_audio,
    decode_pcm16,
    decode_wav,
    encode_wav,
    pcm16_bytes,
)

TONE = (0.5 * np.sin(np.arange(4800) * 0.05)).astype(np.float32)


def _sf_wav(x: np.ndarray, rate: int, subtype: str) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, x, rate, subtype=subtype, format="WAV")
    return buf.getvalue()


def _wav(fmt: bytes, data: bytes, *, data_size: int | None = None, extra: bytes = b"") -> bytes:
    """Hand-built RIFF: fmt chunk body `fmt`, optional chunks `extra`, then data (size may lie)."""
    size = len(data) if data_size is None else data_size
    chunks = b"fmt " + struct.pack("<I", len(fmt)) + fmt + extra + b"data" + struct.pack("<I", size) + data
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks


def _fmt(tag: int = 1, channels: int = 1, rate: int = 16000, bits: int = 16) -> bytes:
    block = channels * bits // 8
    return struct.pack("<HHIIHH", tag, channels, rate, rate * block, block, bits)


@pytest.mark.parametrize(
    ("subtype", "tol"),
    [("PCM_U8", 1e-2), ("PCM_16", 1e-4), ("PCM_24", 1e-6), ("PCM_32", 1e-8), ("FLOAT", 0), ("DOUBLE", 0)],
)
def test_decodes_every_sample_format(subtype: str, tol: float) -> None:
    pcm, rate = decode_wav(_sf_wav(TONE, 16000, subtype))
    assert rate == 16000 and pcm.dtype == np.float32 and pcm.shape == TONE.shape
    assert np.abs(pcm - TONE).max() <= tol


@pytest.mark.parametrize("channels", [2, 3, 6])
def test_multichannel_is_averaged_to_mono(channels: int) -> None:
    x = np.stack([TONE * (k % 2) for k in range(channels)], axis=1)  # extensible header for > 2 channels
    pcm, rate = decode_wav(_sf_wav(x, 44100, "PCM_16"))
    assert rate == 44100
    np.testing.assert_allclose(pcm, x.mean(axis=1), atol=1e-4)


@pytest.mark.parametrize("rate", [8000, 22050, 24000, 48000, 96000])
def test_any_rate(rate: int) -> None:
    assert decode_wav(_sf_wav(TONE, rate, "PCM_16"))[1] == rate


@pytest.mark.parametrize("claimed", [0, 0xFFFFFFFF, 10**6])
def test_data_size_that_lies_is_clamped_to_the_bytes_present(claimed: int) -> None:
    data = pcm16_bytes(TONE)
    pcm, _ = decode_wav(_wav(_fmt(), data, data_size=claimed))
    assert pcm.size == TONE.size


def test_truncated_file_drops_the_partial_frame() -> None:
    full = _wav(_fmt(channels=2), pcm16_bytes(np.repeat(TONE, 2)))
    pcm, _ = decode_wav(full[:-3])  # cut in the middle of a stereo frame
    assert pcm.size == TONE.size - 1


def test_wrong_block_align_and_byte_rate_are_ignored() -> None:
    fmt = struct.pack("<HHIIHH", 1, 1, 16000, 1, 7, 16)
    pcm, _ = decode_wav(_wav(fmt, pcm16_bytes(TONE)))
    np.testing.assert_allclose(pcm, TONE, atol=1e-4)


def test_skips_other_chunks_with_odd_size_padding() -> None:
    extra = b"LIST" + struct.pack("<I", 3) + b"abc" + b"\0"  # odd-sized chunk + pad byte
    pcm, _ = decode_wav(_wav(_fmt(), pcm16_bytes(TONE), extra=extra))
    np.testing.assert_allclose(pcm, TONE, atol=1e-4)


def test_extensible_float() -> None:
    fmt = (
        struct.pack("<HHIIHHHHI", 0xFFFE, 1, 16000, 64000, 4, 32, 22, 32, 4)
        + struct.pack("<H", 3)
        + bytes(14)
    )
    pcm, _ = decode_wav(_wav(fmt, TONE.astype("<f4").tobytes()))
    np.testing.assert_array_equal(pcm, TONE)


def test_float_nan_and_out_of_range_are_sanitized() -> None:
    x = np.array([np.nan, 2.0, -3.0, np.inf, 0.5], np.float32)
    pcm, _ = decode_wav(_wav(_fmt(tag=3, bits=32), x.astype("<f4").tobytes()))
    np.testing.assert_array_equal(pcm, [0.0, 1.0, -1.0, 1.0, 0.5])


def test_empty_data_chunk_decodes_to_no_samples() -> None:
    pcm, rate = decode_wav(_wav(_fmt(), b""))
    assert pcm.size == 0 and rate == 16000


@pytest.mark.parametrize(
    ("blob", "match"),
    [
        (b"RIFF", "only 4 bytes"),
        (b"ID3\x04" + bytes(40), "missing RIFF/WAVE"),
        (b"RIFX" + bytes(4) + b"WAVE", "big-endian"),
        (b"RIFF\0\0\0\0WAVEdata\0\0\0\0", "data chunk comes before the fmt"),
        (b"RIFF\0\0\0\0WAVELIST\x02\0\0\0ab", "no fmt chunk"),
        (b"RIFF\0\0\0\0WAVEfmt \x10\0\0\0" + _fmt(), "no data chunk"),
        (b"RIFF\0\0\0\0WAVEfmt \x10\0\0\0" + _fmt()[:8], "truncated WAV: 'fmt '"),
        (_wav(_fmt()[:12], b""), "fmt chunk has 12 bytes"),
        (_wav(_fmt(tag=0x55), b"\0\0"), "format tag 0x0055"),
        (_wav(_fmt(channels=0), b""), "0 channels"),
        (_wav(_fmt(rate=0), b""), "sample rate 0"),
        (_wav(_fmt(bits=12), b""), "12-bit integer"),
        (_wav(_fmt(tag=3, bits=16), b""), "16-bit float"),
    ],
)
def test_bad_files_raise_clear_errors(blob: bytes, match: str) -> None:
    with pytest.raises(AudioDecodeError, match=match):
        decode_wav(blob)


def test_audio_decode_error_is_a_value_error() -> None:
    assert issubclass(AudioDecodeError, ValueError)


def test_encode_wav_is_a_standard_16_bit_mono_file() -> None:
    blob = encode_wav(TONE, 24000)
    with wave.open(io.BytesIO(blob)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()) == (
            1,
            2,
            24000,
            TONE.size,
        )
    back, rate = sf.read(io.BytesIO(blob), dtype="float32")
    assert rate == 24000
    np.testing.assert_allclose(back, TONE, atol=1e-4)
    again, _ = decode_wav(blob)
    np.testing.assert_allclose(again, TONE, atol=1e-4)


def test_pcm16_bytes_clips_and_zeroes_nan() -> None:
    raw = pcm16_bytes(np.array([0.0, 1.5, -1.5, np.nan, 0.5], np.float32))
    assert np.frombuffer(raw, "<i2").tolist() == [0, 32767, -32767, 0, 16384]


def test_decode_base64_wav_and_pcm16() -> None:
    pcm, rate = decode_base64_audio(base64.b64encode(encode_wav(TONE, 16000)).decode(), "wav")
    assert rate == 16000 and pcm.size == TONE.size
    pcm, rate = decode_base64_audio(base64.b64encode(pcm16_bytes(TONE)).decode(), "pcm16")
    assert rate == 24000
    np.testing.assert_allclose(pcm, TONE, atol=1e-4)


def test_decode_base64_tolerates_data_urls_wrapping_and_missing_padding() -> None:
    b64 = base64.b64encode(pcm16_bytes(TONE[:7])).decode()
    assert b64.endswith("=")
    wrapped = "\n".join(b64[i : i + 8] for i in range(0, len(b64), 8)).rstrip("=")
    assert decode_base64_audio("data:audio/pcm;base64," + wrapped, "PCM16")[0].size == 7


@pytest.mark.parametrize(
    ("data", "fmt", "match"),
    [
        ("AAAA", "mp3", "unsupported input audio format 'mp3'; use 'wav' or 'pcm16'"),
        ("not base64 at all!", "wav", "not valid base64"),
        (base64.b64encode(b"\0\0\0").decode(), "pcm16", "even number of bytes"),
        (base64.b64encode(b"hello world!").decode(), "wav", "missing RIFF/WAVE"),
    ],
)
def test_decode_base64_errors(data: str, fmt: str, match: str) -> None:
    with pytest.raises(AudioDecodeError, match=match):
        decode_base64_audio(data, fmt)


def test_decode_pcm16_empty() -> None:
    assert decode_pcm16(b"").size == 0
