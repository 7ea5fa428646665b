"""The streaming resampler: any chunking gives exactly the one-shot result (no clicks, no drift)."""

from __future__ import annotations

import numpy as np
import pytest
import soxr

from omnivoice.audio.resample import (
    HALF_BAND_DELAY,
    HalfBandUpsampler,
    Resampler,
    StreamResampler,
    input_resampler,
)


def chunked(r: Resampler, x: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    """What `r` makes of `x` given in chunks of `sizes` (the rest in one last chunk)."""
    out, pos = [], 0
    for n in sizes:
        out.append(r.process(x[pos : pos + n]))
        pos += n
        if pos >= x.size:
            break
    out.append(r.process(x[pos:]))
    return out


@pytest.mark.parametrize(("src", "dst"), [(24000, 16000), (8000, 16000), (24000, 8000)])
def test_chunked_equals_whole(src: int, dst: int) -> None:
    rng = np.random.default_rng(0)
    x = (0.3 * np.sin(2 * np.pi * 300 * np.arange(3 * src) / src)).astype(np.float32)
    sizes = rng.integers(1, src // 10, size=400)
    r = StreamResampler(src, dst)
    y = np.concatenate([*chunked(r, x, sizes), r.flush()])
    ref = soxr.resample(x, src, dst)
    assert y.size == ref.size == 3 * dst
    np.testing.assert_allclose(y, ref, atol=1e-6)
    # after a flush the stream starts afresh
    again = np.concatenate([r.process(x), r.flush()])
    np.testing.assert_allclose(again, ref, atol=1e-6)


def test_identity_when_rates_match() -> None:
    r = StreamResampler(24000, 24000)
    x = np.ones(100, np.float32)
    assert r.process(x) is not None and np.array_equal(r.process(x), x) and r.flush().size == 0


def test_a_caller_at_half_the_rate_gets_the_half_band_upsampler_else_soxr() -> None:
    assert isinstance(input_resampler(8000, 16000), HalfBandUpsampler)
    assert isinstance(input_resampler(24000, 16000), StreamResampler)
    assert isinstance(input_resampler(16000, 16000), StreamResampler)  # identity


def test_the_half_band_upsampler_chunked_equals_whole_and_holds_back_only_its_delay() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal(8000).astype(np.float32)
    whole = HalfBandUpsampler(8000)
    ref = np.concatenate([whole.process(x), whole.flush()])
    assert ref.size == 2 * x.size  # time-aligned: the delay is not in the output
    r = HalfBandUpsampler(8000)
    parts = chunked(r, x, rng.integers(1, 60, size=800))  # chunks shorter than its delay too
    y = np.concatenate([*parts, r.flush()])
    np.testing.assert_array_equal(y, ref)
    # 20 ms appends: each one's output is ready at once, but for the delay's worth
    r, sent, made = HalfBandUpsampler(8000), 0, 0
    for _ in range(50):
        made += r.process(rng.standard_normal(160).astype(np.float32)).size
        sent += 160
        assert made == 2 * (sent - HALF_BAND_DELAY)
    assert r.flush().size == 2 * HALF_BAND_DELAY  # what it held back
    # after a flush the stream starts afresh
    np.testing.assert_array_equal(np.concatenate([r.process(x), r.flush()]), ref)
    short = HalfBandUpsampler(8000)  # a stream shorter than the delay still comes out whole
    assert short.process(x[:5]).size == 0 and short.flush().size == 10


def test_the_half_band_upsampler_keeps_the_band_and_rejects_the_images() -> None:
    rate = 8000
    t = np.arange(2 * rate) / rate
    tones = [(300, 0.0), (1000, 1.0), (2500, 2.0), (3300, 0.5)]
    x = np.sum([0.2 * np.sin(2 * np.pi * f * t + ph) for f, ph in tones], axis=0).astype(np.float32)
    r = HalfBandUpsampler(rate)
    y = np.concatenate([r.process(x), r.flush()])
    t2 = np.arange(y.size) / (2 * rate)
    ideal = np.sum([0.2 * np.sin(2 * np.pi * f * t2 + ph) for f, ph in tones], axis=0)
    inner = slice(400, -400)  # away from the stream's ends
    assert np.abs(y[inner] - ideal[inner]).max() < 2e-3  # in band, in phase: as the tones themselves
    # each tone's image (rate - f) is at least 70 dB below it
    n = 8192
    spectrum = np.abs(np.fft.rfft(y[2000 : 2000 + n] * np.hanning(n)))
    freqs = np.fft.rfftfreq(n, 1 / (2 * rate))
    for f, _ in tones:
        tone = spectrum[np.argmin(abs(freqs - f))]
        image = spectrum[np.argmin(abs(freqs - (rate - f)))]
        assert 20 * np.log10(tone / image) > 70, f
    # and it agrees with soxr's HQ on what the telephone band holds
    ref = soxr.resample(x, rate, 2 * rate)
    assert np.abs(y[inner] - ref[inner]).max() < 2e-3
