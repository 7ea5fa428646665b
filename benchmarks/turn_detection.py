"""Turn detection on spoken questions: semantic_vad (each eagerness) against server_vad, over a running
server's /v1/realtime, on the espeak-ng clips of benchmarks/turn_clips.

Each clip is one session: 0.5 s of silence, the clip, then silence, streamed in real time in 20 ms
appends, until the turn's response is done (`--hang-up`: until it begins). Reported per
turn-detection mode:

- complete questions: voice-to-voice (the first `response.output_audio.delta` - the moment the last
  speech chunk was sent) and turn detection (`speech_stopped`'s arrival - that moment), p50 / p95;
- broken questions (a 400-900 ms pause mid-sentence): the share cut at the pause (a `speech_stopped`
  whose audio_end_ms lies before the pause's end);
- the server's time per pause for the end-of-turn model (queue, features, model; from /metrics).

Then, in this process (the model as the server runs it, on this machine's CPU): the model's time per
pause, features and one run, one pause at a time and in batches.

    omnivoice serve --port 8000 &
    python benchmarks/turn_detection.py --base-url http://127.0.0.1:8000 \\
        --output-json benchmarks/results/cpu-turn-detection.json
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import soxr
import websockets

from omnivoice.audio import decode_wav
from omnivoice.bench.metrics import percentile
from omnivoice.bench.report import describe_machine

RATE = 24000
CHUNK = RATE * 2 // 50  # 20 ms of pcm16
LEAD_S = 0.5
CLIPS = Path(__file__).parent / "turn_clips"
MODES = ("server_vad:500", "semantic_vad:low", "semantic_vad:medium", "semantic_vad:high")


@dataclass
class Clip:
    name: str
    kind: str
    pcm16: bytes  # 24 kHz
    pcm: np.ndarray  # 16 kHz float32, as in the file
    pause: tuple[int, int] | None  # [start, end) samples at 16 kHz


@dataclass
class Record:
    clip: str
    kind: str
    speech_end: float = 0.0
    stops: list[tuple[float, int]] = field(default_factory=list)  # (arrival, audio_end_ms)
    first_audio: float | None = None
    cut: bool = False
    error: str | None = None


def load_clips(folder: Path) -> list[Clip]:
    manifest = json.loads((folder / "clips.json").read_text())
    out = []
    for c in manifest["clips"]:
        pcm, rate = decode_wav((folder / c["file"]).read_bytes())
        x = np.clip(soxr.resample(pcm, rate, RATE), -1, 1)
        pause = tuple(c["pause"]) if "pause" in c else None
        out.append(Clip(c["file"], c["kind"], (x * 32767).astype("<i2").tobytes(), pcm, pause))  # type: ignore[arg-type]
    return out


def turn_detection(mode: str) -> dict[str, Any]:
    kind, value = mode.split(":")
    if kind == "server_vad":
        return {"type": "server_vad", "silence_duration_ms": int(value)}
    return {"type": "semantic_vad", "eagerness": value}


async def run_clip(url: str, mode: str, clip: Clip, args: argparse.Namespace) -> Record:
    """One session saying `clip`; a session the server refuses (1013: at capacity) is tried again."""
    for _ in range(args.retries):
        try:
            return await _run_clip(url, mode, clip, args)
        except websockets.ConnectionClosed as e:
            if e.rcvd is None or e.rcvd.code != 1013:
                return Record(clip.name, clip.kind, error=f"closed: {e}")
            await asyncio.sleep(2.0)
    return Record(clip.name, clip.kind, error="refused: the server stayed at capacity")


async def _run_clip(url: str, mode: str, clip: Clip, args: argparse.Namespace) -> Record:
    rec = Record(clip.name, clip.kind)
    session: dict[str, Any] = {
        "type": "realtime",
        "audio": {"input": {"turn_detection": turn_detection(mode)}},
        "max_output_tokens": args.max_output_tokens,
        "omnivoice": {"min_output_tokens": args.max_output_tokens, "output_audio_frames": args.audio_frames},
    }
    clip_end_ms = 1000 * (LEAD_S + len(clip.pcm16) / 2 / RATE)
    done = asyncio.Event()
    async with websockets.connect(url, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.update", "session": session}))

        async def read() -> None:
            async for message in ws:
                e, now = json.loads(message), time.monotonic()
                if e["type"] == "input_audio_buffer.speech_stopped":
                    rec.stops.append((now, e["audio_end_ms"]))
                elif e["type"] == "response.output_audio.delta":
                    rec.first_audio = now if rec.first_audio is None else rec.first_audio
                    if args.hang_up and rec.stops and rec.stops[-1][1] >= clip_end_ms:
                        done.set()  # the answer to the whole clip has begun: all that is measured
                elif e["type"] == "response.done" and rec.stops and rec.stops[-1][1] >= clip_end_ms:
                    done.set()
                elif e["type"] == "error":
                    rec.error = e["error"].get("message")
                    done.set()

        reader = asyncio.create_task(read())
        audio = bytes(int(LEAD_S * RATE) * 2) + clip.pcm16
        clock = time.monotonic()
        for i in range(0, len(audio), CHUNK):
            clock = await send_at(ws, audio[i : i + CHUNK], clock)
        rec.speech_end = time.monotonic()
        deadline = rec.speech_end + args.turn_timeout_s
        while not done.is_set() and time.monotonic() < deadline:
            clock = await send_at(ws, bytes(CHUNK), clock)
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
    if not done.is_set() and rec.error is None:
        rec.error = "timeout"
    if clip.pause is not None:
        pause_end_ms = 1000 * LEAD_S + clip.pause[1] / 16
        rec.cut = any(end <= pause_end_ms for _, end in rec.stops)
    return rec


async def send_at(ws: Any, chunk: bytes, clock: float) -> float:
    delay = clock - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
    await ws.send(
        json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(chunk).decode()})
    )
    return clock + 0.02


async def run_mode(url: str, mode: str, clips: list[Clip], args: argparse.Namespace) -> list[Record]:
    queue = [c for _ in range(args.repeats) for c in clips]
    records: list[Record] = []

    async def worker() -> None:
        while queue:
            clip = queue.pop(0)
            r = await run_clip(url, mode, clip, args)
            records.append(r)
            if not args.quiet:
                v2v = 1000 * (r.first_audio - r.speech_end) if r.first_audio else float("nan")
                print(f"  {mode} {r.clip}: v2v {v2v:.0f} ms cut {r.cut} {r.error or ''}", file=sys.stderr)

    await asyncio.gather(*(worker() for _ in range(args.sessions)))
    return records


def stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "n": 0}
    return {"p50": percentile(values, 50), "p95": percentile(values, 95), "n": len(values)}


def pause_histogram(base_url: str) -> dict[str, float]:
    """The server's omnivoice_turn_model_pause_seconds buckets ({le: count}, with sum and count)."""
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    out: dict[str, float] = {}
    for le, value in re.findall(r'omnivoice_turn_model_pause_seconds_bucket\{le="([^"]+)"\} (\S+)', text):
        out[le] = float(value)
    for key in ("sum", "count"):
        m = re.search(rf"omnivoice_turn_model_pause_seconds_{key} (\S+)", text)
        out[key] = float(m.group(1)) if m else 0.0
    return out


def histogram_quantile(q: float, before: dict[str, float], after: dict[str, float]) -> float | None:
    """Prometheus' histogram_quantile over the buckets' increase: linear within a bucket."""
    bounds = sorted((float(k), after[k] - before.get(k, 0.0)) for k in after if k not in ("sum", "count"))
    total = bounds[-1][1] if bounds else 0.0
    if total <= 0:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for upper, count in bounds:
        if count >= rank:
            if upper == float("inf"):
                return lower
            return lower + (upper - lower) * (rank - below) / max(count - below, 1e-9)
        lower, below = upper, count
    return lower


def summarize(records: list[Record], before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    complete = [r for r in records if r.kind == "complete" and r.error is None and r.first_audio]
    broken = [r for r in records if r.kind == "broken" and r.error is None]
    pauses = after.get("count", 0.0) - before.get("count", 0.0)
    pause_ms = {
        "pauses": pauses,
        "mean": 1000 * (after.get("sum", 0.0) - before.get("sum", 0.0)) / pauses if pauses else None,
        "p50": _ms(histogram_quantile(0.5, before, after)),
        "p95": _ms(histogram_quantile(0.95, before, after)),
    }
    return {
        "complete_voice_to_voice_ms": stats([1000 * (r.first_audio - r.speech_end) for r in complete]),  # type: ignore[operator]
        "complete_turn_detection_ms": stats(
            [1000 * (r.stops[0][0] - r.speech_end) for r in complete if r.stops]
        ),
        "broken_cut": sum(r.cut for r in broken),
        "broken_total": len(broken),
        "errors": sum(r.error is not None for r in records),
        "server_pause_ms": pause_ms,
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000 * seconds


def model_times(clips: list[Clip], threads: int, rounds: int) -> dict[str, Any]:
    """The end-of-turn model in this process: per pause, features plus one run (batch 1), and a run
    of 8 and 32 pauses together (per pause)."""
    from omnivoice.audio.smart_turn import SmartTurn

    model = SmartTurn(threads=threads)
    at_pause = []
    for c in clips:
        end = c.pause[0] + 1536 if c.pause else c.pcm.size
        at_pause.append(np.concatenate([c.pcm[:end], np.zeros(1536 if not c.pause else 0, np.float32)]))
    model.score(at_pause[:1])  # warm-up
    single = []
    for _ in range(rounds):
        for clip in at_pause:
            t0 = time.perf_counter()
            model.score([clip])
            single.append(1000 * (time.perf_counter() - t0))
    out: dict[str, Any] = {"threads": threads, "batch_1_ms": stats(single)}
    for size in (8, 32):
        batch = (at_pause * (size // len(at_pause) + 1))[:size]
        runs = []
        for _ in range(max(1, rounds // 2)):
            t0 = time.perf_counter()
            model.score(batch)
            runs.append(1000 * (time.perf_counter() - t0))
        out[f"batch_{size}_run_ms"] = stats(runs)
        out[f"batch_{size}_per_pause_ms"] = stats([r / size for r in runs])
    return out


def table(report: dict[str, Any]) -> str:
    lines = [
        f"turn detection: {report['clips']} clips x {report['repeats']}, {report['machine']}",
        "mode                  v2v p50/p95 ms   detect p50/p95 ms   broken cut   server ms/pause p50/p95",
    ]
    for mode, s in report["modes"].items():
        v, d, p = s["complete_voice_to_voice_ms"], s["complete_turn_detection_ms"], s["server_pause_ms"]
        lines.append(
            f"{mode:<21} {_f(v['p50'])} / {_f(v['p95']):<8} {_f(d['p50'])} / {_f(d['p95']):<11} "
            f"{s['broken_cut']}/{s['broken_total']:<10} {_f(p['p50'])} / {_f(p['p95'])}"
        )
    for m in report.get("models") or []:
        lines.append(
            f"model in-process ({m['threads']} threads): per pause p50/p95 {_f(m['batch_1_ms']['p50'])} / "
            f"{_f(m['batch_1_ms']['p95'])} ms; batch of 8: {_f(m['batch_8_per_pause_ms']['p50'])} ms a "
            f"pause; batch of 32: {_f(m['batch_32_per_pause_ms']['p50'])} ms a pause"
        )
    return "\n".join(lines)


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument(
        "--modes", default=",".join(MODES),
        help="comma-separated: server_vad:MS, semantic_vad:E ('': no server runs, the model timing only)",
    )  # fmt: skip
    p.add_argument("--clips", type=Path, default=CLIPS)
    p.add_argument("--repeats", type=int, default=1, help="each clip this many times per mode")
    p.add_argument("--sessions", type=int, default=1, help="clips run at once")
    p.add_argument("--max-output-tokens", type=int, default=8)
    p.add_argument("--audio-frames", type=int, default=12, help="omnivoice: fixed talker frames per answer")
    p.add_argument("--turn-timeout-s", type=float, default=30.0)
    p.add_argument(
        "--hang-up", action="store_true",
        help="end a clip's session once the answer to the whole clip has begun (its first audio is "
        "all that is measured) instead of once that answer is done; the engine then holds fewer "
        "answers at once than live callers would make it",
    )  # fmt: skip
    p.add_argument("--kinds", default="complete,broken", help="which clips: complete, broken or both")
    p.add_argument("--retries", type=int, default=5, help="tries of a session the server refuses")
    p.add_argument(
        "--model-threads", type=int, nargs="+", default=[2],
        help="in-process model timing, with each of these intra-op thread counts (0: skip it)",
    )  # fmt: skip
    p.add_argument("--model-rounds", type=int, default=4)
    p.add_argument("--machine", default=None)
    p.add_argument("--output-json", type=Path, default=None)
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args()
    kinds = set(args.kinds.split(","))
    if not kinds <= {"complete", "broken"}:
        p.error(f"--kinds: complete and/or broken, got {args.kinds!r}")
    clips = [c for c in load_clips(args.clips) if c.kind in kinds]
    url = args.base_url.rstrip("/").replace("http", "ws", 1) + "/v1/realtime?model=omnivoice"
    modes: dict[str, Any] = {}
    for mode in filter(None, args.modes.split(",")):
        before = pause_histogram(args.base_url)
        records = asyncio.run(run_mode(url, mode, clips, args))
        modes[mode] = summarize(records, before, pause_histogram(args.base_url))
        modes[mode]["records"] = [r.__dict__ for r in records]
    report: dict[str, Any] = {
        "kind": "turn_detection",
        "command": " ".join(sys.argv),
        "machine": args.machine or describe_machine(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "clips": len(clips),
        "repeats": args.repeats,
        "sessions": args.sessions,
        "kinds": sorted(kinds),
        "hang_up": args.hang_up,
        "modes": modes,
        "models": [model_times(clips, n, args.model_rounds) for n in args.model_threads if n > 0],
    }
    print(table(report))
    if args.output_json is not None:
        args.output_json.parent.mkdir(parents=True, exist_ok=True)
        args.output_json.write_text(json.dumps(report, indent=1) + "\n")
    return 0 if all(m["errors"] == 0 for m in modes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
