"""`omnivoice bench front-door`: the realtime front door alone (no network, no engine): N sessions'
20 ms appends of speech at real-time pace, decoded, resampled and scored (VAD, a spoken turn's log-mel)
by one `FrontDoor` with `--workers` threads, or each append alone (`--per-session`, the path before
batching). Reports the CPU seconds the process used per second of audio per session, the lag of each
append's result behind real time (p50/p95/max), and the turns heard against those the per-session path
hears in the same audio; prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import soxr

from omnivoice.audio import decode_wav
from omnivoice.audio.front_door import FrontDoor
from omnivoice.audio.log_mel import LogMel
from omnivoice.audio.vad import FRAME_MS, SileroVad
from omnivoice.bench.front_door_load import (
    CHUNK_S,
    WIRE_RATE,
    Caller,
    Detector,
    call,
    expected_turns,
    wire_chunks,
)
from omnivoice.bench.metrics import percentile
from omnivoice.bench.report import describe_machine, write_json

DEFAULT_SPEECH = "Hello there. Could you tell me a short story about a lighthouse keeper?"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--sessions", default="8,32,64", help="comma-separated session counts, one run each")
    a("--seconds", type=float, default=20.0, help="audio each session sends per run")
    a("--workers", type=int, default=2, help="front-door threads (server.audio_workers)")
    a(
        "--batch-ms",
        type=float,
        default=3.0,
        help="an append waits this long for others to join its batch (server.audio_batch_ms)",
    )
    a("--per-session", action="store_true", help="each append alone in its own thread call (workers 0)")
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--speech-text", default=DEFAULT_SPEECH, help="what each caller says (espeak-ng)")
    src.add_argument("--speech-wav", type=Path, default=None, help="a WAV file each caller says instead")
    a("--gap-s", type=float, default=1.5, help="silence after each time the speech is said")
    a("--silence-ms", type=int, default=500, help="server_vad silence_duration_ms that ends a turn")
    a("--ramp-s", type=float, default=1.0, help="the sessions' starts spread over this many seconds")
    a("--output-json", type=Path, default=None, help="default: benchmarks/results/front-door-MODE-DATE.json")
    a("--label", default=None, help="free text stored in the report")
    a("--quiet", action="store_true", help="no progress lines on stderr")


def load_speech(args: argparse.Namespace) -> np.ndarray:
    """The caller's clip at 24 kHz, from --speech-wav or spoken by espeak-ng."""
    if args.speech_wav is not None:
        pcm, rate = decode_wav(args.speech_wav.read_bytes())
    else:
        if shutil.which("espeak-ng") is None:
            raise ValueError("espeak-ng is not installed: install it or pass --speech-wav")
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "speech.wav"
            subprocess.run(["espeak-ng", "-w", str(path), args.speech_text], check=True, capture_output=True)
            pcm, rate = decode_wav(path.read_bytes())
    return soxr.resample(pcm, rate, WIRE_RATE).astype(np.float32) if rate != WIRE_RATE else pcm


def model_log_mel() -> LogMel:
    """The thinker's features (Whisper's 128 mels, 25 ms windows, 10 ms hop)."""
    from transformers import WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor(
        feature_size=128, sampling_rate=16000, hop_length=160, chunk_length=300, n_fft=400
    )
    return LogMel.of(extractor)


async def one_run(
    n: int, cycle: list[str], args: argparse.Namespace, vad: SileroVad, log_mel: LogMel
) -> dict[str, Any]:
    """`n` sessions for --seconds: the figures of one run."""
    workers = 0 if args.per_session else args.workers
    silence_frames = max(1, -(-args.silence_ms // FRAME_MS))
    count = int(args.seconds / CHUNK_S)
    # each session says the same thing from its own point of it
    sends = [[cycle[(i * 37 + k) % len(cycle)] for k in range(count)] for i in range(n)]
    expected = [expected_turns(vad, chunks, silence_frames) for chunks in sends]
    door = FrontDoor(workers, args.batch_ms / 1000)
    callers = [Caller(vad.stream(), log_mel, Detector(silence_frames)) for _ in range(n)]
    done, total = [0], n * count

    def progress() -> None:
        done[0] += 1
        if not args.quiet and done[0] % max(1, total // 10) == 0:
            print(f"  [{n} sessions] {done[0]}/{total} appends", file=sys.stderr, flush=True)

    t0 = time.perf_counter() + 0.1
    cpu0, wall0 = time.process_time(), time.perf_counter()
    try:
        results = await asyncio.gather(
            *(
                call(door, c, s, t0 + args.ramp_s * i / n, progress)
                for i, (c, s) in enumerate(zip(callers, sends, strict=True))
            )
        )
    finally:
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        await door.close()
    lags = [1000 * lag for r in results for lag in r.lags_s]
    return {
        "sessions": n,
        "workers": workers,
        "batch_ms": args.batch_ms if workers else None,
        "audio_s_per_session": count * CHUNK_S,
        "cpu_s": round(cpu, 3),
        "wall_s": round(wall, 3),
        "cores_used": round(cpu / wall, 3),
        "cpu_s_per_audio_s_per_session": round(cpu / (n * count * CHUNK_S), 5),
        "lag_ms": {"p50": percentile(lags, 50), "p95": percentile(lags, 95), "max": max(lags)},
        "turns_started": sum(len(r.starts) for r in results),
        "turns_ended": sum(len(r.stops) for r in results),
        "expected_started": sum(e[0] for e in expected),
        "expected_ended": sum(e[1] for e in expected),
        "windows_ahead": sum(r.windows for r in results),
        "ticks": door.ticks,
        "mean_batch": round(door.jobs / door.ticks, 2) if door.ticks else None,
        "workers_busy_s": round(door.busy_s, 3) if door.ticks else None,
        "mean_queued_ms": round(1000 * door.waited_s / door.jobs, 2) if door.jobs else None,
    }


def format_rows(runs: list[dict[str, Any]]) -> str:
    head = (
        "| sessions | workers | CPU s / audio s / session | cores used | lag p50 / p95 / max "
        "| turns heard / expected | mean batch |"
    )
    lines = [head, "|---|---|---|---|---|---|---|"]
    for r in runs:
        lag = r["lag_ms"]
        workers = r["workers"] or "per-session"
        lines.append(
            f"| {r['sessions']} | {workers} | {r['cpu_s_per_audio_s_per_session']:.4f} | "
            f"{r['cores_used']:.2f} | {lag['p50']:.0f} / {lag['p95']:.0f} / {lag['max']:.0f} ms | "
            f"{r['turns_started']}+{r['turns_ended']} / {r['expected_started']}+{r['expected_ended']} | "
            f"{r['mean_batch'] if r['mean_batch'] is not None else '-'} |"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; 0 when every run heard the expected turns, 1 if not, 2 on bad options."""
    try:
        sessions = [int(s) for s in args.sessions.split(",") if s.strip()]
        if not sessions or min(sessions) < 1 or args.seconds <= 0 or args.workers < 1:
            raise ValueError("--sessions, --seconds and --workers must be positive")
        speech = load_speech(args)
    except (ValueError, OSError, subprocess.CalledProcessError) as e:
        print(f"omnivoice bench front-door: {e}", file=sys.stderr)
        return 2
    gap = np.zeros(int(args.gap_s * WIRE_RATE), np.float32)
    cycle_audio = np.concatenate([speech, gap])
    cycle_audio = np.pad(cycle_audio, (0, -cycle_audio.size % int(WIRE_RATE * CHUNK_S)))
    cycle = wire_chunks(cycle_audio)
    vad, log_mel = SileroVad(), model_log_mel()
    mode = "per-session" if args.per_session else f"workers{args.workers}"
    print(f"front door, {mode}: {sessions} sessions, {args.seconds:g} s of audio each", file=sys.stderr)
    asyncio.run(_warm(cycle, vad, log_mel))
    runs = []
    for n in sessions:
        runs.append(asyncio.run(one_run(n, cycle, args, vad, log_mel)))
    print(format_rows(runs))
    date = datetime.date.today().isoformat()
    path = args.output_json or Path("benchmarks/results") / f"front-door-{mode}-{date}.json"
    report = {
        "benchmark": "front-door",
        "label": args.label,
        "machine": describe_machine(),
        "date": date,
        "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "speech_s": round(speech.size / WIRE_RATE, 3),
        "gap_s": args.gap_s,
        "silence_ms": args.silence_ms,
        "runs": runs,
    }
    write_json(report, path)
    print(f"wrote {path}", file=sys.stderr)
    heard = all(
        r["turns_started"] == r["expected_started"] and r["turns_ended"] == r["expected_ended"] for r in runs
    )
    return 0 if heard else 1


async def _warm(cycle: list[str], vad: SileroVad, log_mel: LogMel) -> None:
    """Two sessions' second of audio through a front door, untimed (first calls set things up)."""
    door = FrontDoor(1)
    callers = [Caller(vad.stream(), log_mel, Detector(16)) for _ in range(2)]
    try:
        await asyncio.gather(*(call(door, c, cycle[:50], time.perf_counter() - 10) for c in callers))
    finally:
        await door.close()
