"""How much of a realtime append's audio the input resampler holds back, per rate and soxr quality.

    python benchmarks/resample_holdback.py --out benchmarks/results/cpu-resample-holdback-DATE.json

A session's caller audio reaches the VAD and the log-mel features at 16 kHz through soxr's stream
(`StreamResampler`, quality HQ), or at 8 kHz (G.711) through the half-band upsampler
(`HalfBandUpsampler`). soxr works in blocks, so after each append some of the audio sent so far has
not come out yet: the VAD hears the end of a turn that much later. This feeds 20 ms appends of noise
(the realtime bench's pace) at each input rate through a stream of each soxr quality (and the
half-band upsampler at 8 kHz) and prints, after each append past a warm-up, how many ms of the audio
sent so far are still held back (min, mean, max), the CPU time of one append (µs, the mean over all
of them) and the output sizes of the first appends.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import soxr

from omnivoice.audio.resample import HalfBandUpsampler

RATES = (24000, 8000, 48000)  # pcm16 realtime, G.711 (Twilio), WebRTC's Opus
QUALITIES = ("HQ", "MQ", "LQ", "QQ")
OUT_RATE = 16000
APPEND_MS = 20


def held_back(rate: int, quality: str, appends: int, warm: int) -> dict[str, object]:
    """`quality` a soxr quality, or "half-band": the server's HalfBandUpsampler (8 kHz input)."""
    stream: Any = (
        HalfBandUpsampler(rate)
        if quality == "half-band"
        else soxr.ResampleStream(rate, OUT_RATE, 1, "float32", quality)
    )
    step = stream.process if quality == "half-band" else stream.resample_chunk
    rng = np.random.default_rng(0)
    n_in = rate * APPEND_MS // 1000
    out_total, lags, sizes = 0, [], []
    chunks = [rng.standard_normal(n_in).astype(np.float32) for _ in range(appends)]
    cpu = time.process_time()
    outs = [step(c).size for c in chunks]
    cpu_us = 1e6 * (time.process_time() - cpu) / appends
    for k, got in enumerate(outs, start=1):
        sizes.append(got)
        out_total += got
        if k > warm:
            lags.append(1000 * (k * n_in / rate - out_total / OUT_RATE))
    return {
        "rate": rate,
        "quality": quality,
        "held_back_ms": {"min": min(lags), "mean": sum(lags) / len(lags), "max": max(lags)},
        "cpu_us_per_append": cpu_us,
        "first_output_sizes": sizes[:12],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--appends", type=int, default=500, help="20 ms appends per stream")
    parser.add_argument("--warm", type=int, default=20, help="appends not counted at the start")
    parser.add_argument("--out", type=Path, default=None, help="JSON of the figures")
    args = parser.parse_args()
    rows = []
    print(f"{'rate':>6} {'quality':>7}  held back ms: min / mean / max   CPU us   first output sizes")
    for rate in RATES:
        for quality in (*QUALITIES, "half-band") if 2 * rate == OUT_RATE else QUALITIES:
            r = held_back(rate, quality, args.appends, args.warm)
            h = r["held_back_ms"]
            assert isinstance(h, dict)
            print(
                f"{rate:>6} {quality:>7}  {h['min']:5.1f} / {h['mean']:5.1f} / {h['max']:5.1f}"
                f"        {r['cpu_us_per_append']:6.1f}   {r['first_output_sizes']}"
            )
            rows.append(r)
    if args.out is not None:
        report = {
            "kind": "resample_holdback",
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "append_ms": APPEND_MS,
            "out_rate": OUT_RATE,
            "soxr": soxr.__version__,
            "rows": rows,
        }
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
