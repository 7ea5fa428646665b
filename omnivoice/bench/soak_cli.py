"""`omnivoice bench soak`: a long realtime run of talking, barging in and hanging up abruptly against a
running server, then a check that the server let go of everything.

    omnivoice bench soak --base-url http://127.0.0.1:8000 --concurrency 4 --disconnects 1000

Before the load: one warm-up session, then the baseline sample of `/v1/debug/state`. During it: a
sample every --sample-s (and a progress line). After it: wait until nothing is in flight, linger, take
the last sample. Exit 1 when anything leaked (sessions, engine or stage requests, cached prefixes,
KV slots, shared-memory segments, fds or asyncio tasks above the baseline, a replaced stage process),
0 otherwise; the errors the clients saw are reported, not judged.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import httpx

from omnivoice.bench import server_probe as probe
from omnivoice.bench.realtime_load import RATE
from omnivoice.bench.report import describe_machine
from omnivoice.bench.soak_caller import SoakConfig, SoakTally, caller, one_session
from omnivoice.bench.soak_report import format_table, summarize

DEFAULT_SPEECH = "Hello there. How are you today?"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--base-url", default="http://127.0.0.1:8000", help="server root (without /v1); /v1/debug/state must "
      "answer this client (loopback)")  # fmt: skip
    a("--model", default="omnivoice", help="sent as ?model=")
    a("--concurrency", type=int, default=4, help="callers at once, each one session after another")
    a("--duration", type=float, default=None, help="stop starting turns after this many seconds")
    a("--sessions", type=int, default=None, help="stop once this many sessions were opened")
    a("--disconnects", type=int, default=None, help="stop once this many abrupt disconnects were made")
    a("--turns", default="1-4", help="turns per session, MIN-MAX (drawn uniformly)")
    a("--barge-in", type=float, default=0.2, help="share of turns where the caller speaks over the answer")
    a("--disconnect", type=float, default=0.4, help="share of turns ended by an abrupt TCP disconnect")
    a("--within-s", type=float, default=2.0, help="barge-ins and disconnects come up to this long after "
      "the first audio of the answer")  # fmt: skip
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--speech-text", default=DEFAULT_SPEECH, help="what each caller says (espeak-ng)")
    src.add_argument("--speech-wav", type=Path, default=None, help="a WAV file each caller plays instead")
    a("--silence-ms", type=int, default=500, help="server_vad silence_duration_ms")
    a("--max-output-tokens", type=int, default=32, help="session max_output_tokens")
    a(
        "--audio-frames",
        type=int,
        default=60,
        help="omnivoice only: fixed talker frames per answer (80 ms each)",
    )
    a("--turn-timeout", type=float, default=60.0, help="seconds a caller waits for an answer")
    a("--sample-s", type=float, default=5.0, help="seconds between samples of the server's state")
    a("--window-s", type=float, default=60.0, help="latency and memory are reported per window this long")
    a("--settle-s", type=float, default=60.0, help="after the load, wait this long at most for quiescence")
    a("--linger-s", type=float, default=0.0, help="then wait this long more before the last sample "
      "(tombstones of aborted requests expire after 30 s)")  # fmt: skip
    a("--fd-tolerance", type=int, default=4, help="open fds a process may end above its baseline")
    a("--task-tolerance", type=int, default=2, help="asyncio tasks the server may end above its baseline")
    a("--seed", type=int, default=0, help="seeds the callers' choices")
    a("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    a("--output-json", type=Path, default=None, help="write the report (with every sample) as JSON here")
    a("--machine", default=None, help="machine description for the report (default: read off this host)")
    a("--quiet", action="store_true", help="no progress lines on stderr")


def _config(args: argparse.Namespace, speech: bytes) -> SoakConfig:
    lo, _, hi = args.turns.partition("-")
    turns = (int(lo), int(hi or lo))
    if args.concurrency < 1 or turns[0] < 1 or turns[1] < turns[0]:
        raise ValueError("--concurrency must be >= 1 and --turns MIN-MAX with 1 <= MIN <= MAX")
    if not 0 <= args.barge_in + args.disconnect <= 1 or min(args.barge_in, args.disconnect) < 0:
        raise ValueError("--barge-in and --disconnect are shares of turns: each >= 0, together <= 1")
    root = args.base_url.rstrip("/").replace("http", "ws", 1)
    return SoakConfig(
        url=f"{root}/v1/realtime?model={args.model}",
        speech=speech,
        concurrency=args.concurrency,
        turns=turns,
        barge_in=args.barge_in,
        disconnect=args.disconnect,
        within_s=args.within_s,
        silence_ms=args.silence_ms,
        max_output_tokens=args.max_output_tokens,
        audio_frames=args.audio_frames,
        turn_timeout_s=args.turn_timeout,
        api_key=args.api_key,
        seed=args.seed,
    )


def _should_stop(args: argparse.Namespace, tally: SoakTally) -> bool:
    elapsed = time.monotonic() - tally.t0
    return (
        (args.duration is not None and elapsed >= args.duration)
        or (args.sessions is not None and tally.sessions_opened >= args.sessions)
        or (args.disconnects is not None and sum(tally.disconnects.values()) >= args.disconnects)
    )


def _progress(tally: SoakTally, sample: dict[str, Any]) -> str:
    procs = sample["processes"]
    rss = " ".join(f"{name} {p['rss_mb']:.0f}" for name, p in procs.items())
    return (
        f"[{sample['t']:>6.0f} s] sessions {tally.sessions_opened} (held {tally.held}), turns "
        f"{tally.turns_completed}, barge-ins {tally.barge_ins}, disconnects "
        f"{sum(tally.disconnects.values())} (mid-answer {tally.disconnects_mid_response}), errors "
        f"{sum(tally.errors.values())} | server: "
        f"sessions {sample['sessions']}, engine {sample['engine_requests']}, stage tables "
        f"{sample['stage_requests']}, tombstones {sample['tombstones']}, shm {sample['shm_segments']}, "
        f"fds {procs['server']['fds']}, RSS MB {rss}"
    )


async def soak(args: argparse.Namespace, cfg: SoakConfig) -> dict[str, Any]:
    base = args.base_url.rstrip("/")
    say = (lambda line: None) if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    async with httpx.AsyncClient() as client:
        await probe.fetch_state(client, base)  # fails early (403, 404) before any load
        await probe.wait_healthy(client, base, args.settle_s + 600)
        warm = SoakTally()
        say("warm-up: one session, one turn")
        await one_session(
            replace(cfg, turns=(1, 1), barge_in=0, disconnect=0), warm, random.Random(0), asyncio.Event()
        )
        tally = SoakTally()
        baseline, _ = await probe.wait_quiet(client, base, tally.t0, args.settle_s)
        baseline["sessions_opened"] = 0
        say("baseline: " + _progress(tally, baseline))
        stop = asyncio.Event()
        callers = [asyncio.create_task(caller(cfg, i, tally, stop)) for i in range(cfg.concurrency)]
        samples = [baseline]
        while not stop.is_set():
            await asyncio.sleep(args.sample_s)
            samples.append(probe.compact(await probe.fetch_state(client, base), time.monotonic() - tally.t0))
            samples[-1]["sessions_opened"] = tally.sessions_opened  # memory per session (soak_report)
            say(_progress(tally, samples[-1]))
            if _should_stop(args, tally):
                stop.set()
        say("stopping: callers finish their turns")
        await asyncio.gather(*callers)
        load_s = time.monotonic() - tally.t0
        quiet, settle_s = await probe.wait_quiet(
            client, base, tally.t0, args.settle_s, baseline["shm_segments"]
        )
        say(f"quiet after {settle_s:.1f} s" if not probe.busy(quiet) else f"NOT quiet after {settle_s:.1f} s")
        if args.linger_s > 0:
            await asyncio.sleep(args.linger_s)
        end = probe.compact(await probe.fetch_state(client, base), time.monotonic() - tally.t0)
        say("end: " + _progress(tally, end))
    quiet["sessions_opened"] = end["sessions_opened"] = tally.sessions_opened
    samples += [quiet, end]
    report = summarize(tally, samples, baseline, end, load_s, settle_s, args.window_s)
    report["leaks"] = probe.leaks(baseline, end, args.fd_tolerance, args.task_tolerance)
    report["warmup_errors"] = dict(warm.errors)
    return report


def run(args: argparse.Namespace) -> int:
    """0 when nothing leaked, 1 when something did, 2 on bad options or when the server is unusable."""
    from omnivoice.bench.realtime_cli import load_speech

    if args.duration is None and args.sessions is None and args.disconnects is None:
        args.duration = 60.0
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per sample otherwise
    try:
        speech = load_speech(args)
        cfg = _config(args, speech)
    except (ValueError, OSError, subprocess.CalledProcessError) as e:
        print(f"omnivoice bench soak: {e}", file=sys.stderr)
        return 2
    limits = (("duration", args.duration), ("sessions", args.sessions), ("disconnects", args.disconnects))
    until = ", ".join(f"{k} {v}" for k, v in limits if v is not None)
    seconds = len(speech) / 2 / RATE
    print(
        f"soak {cfg.url}: {cfg.concurrency} callers, speech {seconds:.2f} s, until {until}", file=sys.stderr
    )
    try:
        report = asyncio.run(soak(args, cfg))
    except httpx.HTTPError as e:
        print(f"omnivoice bench soak: the server's /v1/debug/state: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    report = {
        "kind": "soak",
        "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "machine": args.machine or describe_machine(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "url": cfg.url,
        "config": {k: v for k, v in asdict(cfg).items() if k not in ("speech", "api_key", "url")},
        "speech_seconds": round(len(speech) / 2 / RATE, 2),
        **report,
    }
    print(format_table(report))
    if args.output_json is not None:
        args.output_json.parent.mkdir(parents=True, exist_ok=True)
        args.output_json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.output_json}", file=sys.stderr)
    return 1 if report["leaks"] else 0
