"""The streaming resampler: any chunking gives exactly the one-shot result (no clicks, no drift)."""

from __future__ import annotations

import numpy as np
import pytest
import soxr

from omnivoice.audio.resample import StreamResampler


@pytest.mark.parametrize(("src", "dst"), [(24000, 16000), (8000, 16000), (24000, 8000)])
def test_chunked_equals_whole(src: int, dst: int) -> None:
    rng = np.random.default_rng(0)
    x = (0.3 * np.sin(2 * np.pi * 300 * np.arange(3 * src) / src)).astype(np.float32)
    sizes = rng.integers(1, src // 10, size=400)
    r = StreamResampler(src, dst)
    out, pos = [], 0
    for n in sizes:
        out.append(r.process(x[pos : pos + n]))
        pos += n
        if pos >= x.size:
            break
    out.append(r.process(x[pos:]))
    out.append(r.flush())
    y = np.concatenate(out)
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
