"""What the front door's per-event work costs the thread that does it: decoding and resampling one
realtime append (24 kHz pcm16 base64 -> 16 kHz float32), one `asyncio.to_thread` round trip (what
moving it to a worker costs), and permessage-deflate of one outgoing audio delta (200 ms of 24 kHz
pcm16 in its JSON event), with the size it saves. Prints the figures; `--output-json` writes them.

    python benchmarks/frontdoor_costs.py --output-json benchmarks/results/cpu-frontdoor-costs.json
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from omnivoice.audio.resample import StreamResampler

RATE = 24000


def speech_like(seconds: float) -> bytes:
    """A voiced tone with a syllable envelope and some noise, as pcm16 (deflate finds little in it,
    as in speech)."""
    t = np.arange(int(RATE * seconds)) / RATE
    rng = np.random.default_rng(0)
    x = 0.3 * np.sin(2 * np.pi * 180 * t) * (
        1 + 0.5 * np.sin(2 * np.pi * 3 * t)
    ) + 0.02 * rng.standard_normal(t.size)
    return (x * 32767).astype("<i2").tobytes()


def per_call_us(f: Callable[[], object], n: int) -> float:
    f()
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t0) / n * 1e6


async def hop_us(n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        await asyncio.to_thread(lambda: None)
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=2000)
    ap.add_argument("--output-json", type=Path, default=None)
    args = ap.parse_args()
    out: dict[str, float] = {}
    for ms in (20, 100):
        b64 = base64.b64encode(speech_like(ms / 1000)).decode()
        r = StreamResampler(RATE, 16000)

        def decode(b64: str = b64, r: StreamResampler = r) -> np.ndarray:
            return r.process(np.frombuffer(base64.b64decode(b64), "<i2").astype(np.float32) / 32768)

        out[f"append_{ms}ms_decode_resample_us"] = per_call_us(decode, args.repeats)
    out["to_thread_round_trip_us"] = asyncio.run(hop_us(args.repeats))
    event = {"type": "response.output_audio.delta", "response_id": "resp_x", "item_id": "item_x"}
    delta = json.dumps({**event, "delta": base64.b64encode(speech_like(0.2)).decode()}).encode()

    def deflate() -> bytes:
        z = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, -15)
        return z.compress(delta) + z.flush(zlib.Z_SYNC_FLUSH)

    out["deflate_200ms_delta_us"] = per_call_us(deflate, args.repeats // 4)
    out["deflated_over_raw_size"] = len(deflate()) / len(delta)
    for k, v in out.items():
        print(f"{k}: {v:.3f}")
    if args.output_json is not None:
        args.output_json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
