"""`omnivoice bench realtime`: concurrent spoken sessions against a server's `/v1/realtime`, or phone
calls against its Twilio bridge (`--transport twilio`, `/v1/telephony/twilio`).

Reports voice-to-voice latency (end of the caller's speech to the first audio delta, or to the first
`media` frame over Twilio) p50/p95, its parts (turn detection, response; realtime only), and gaps in
the output audio (playback stalls). By default the same load runs twice, with the server's speculative
responses on and then off (each session asks for it: `session.omnivoice.speculative_response`, or the
Twilio parameter); each run also reports the speculative responses started, confirmed and dropped and
the work the dropped ones wasted, read from the server's `/v1/debug/state` before and after it, and
the event loop's lag and each engine stage's time over the run, read from its `/metrics`
(bench/server_metrics.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import soxr

from omnivoice.audio import decode_wav
from omnivoice.bench import server_metrics
from omnivoice.bench.metrics import percentile, percentile_interval, playback_stall
from omnivoice.bench.realtime_load import (
    RATE,
    CallerFactory,
    ClientLag,
    RealtimeLoadConfig,
    TurnRecord,
    run_in_processes,
    run_realtime_load,
)
from omnivoice.bench.report import describe_machine
from omnivoice.bench.twilio_load import TwilioCaller

DEFAULT_SPEECH = "Hello there. Could you tell me a short story about a lighthouse keeper?"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--base-url", default="http://127.0.0.1:8000", help="server root (without /v1)")
    a("--model", default="omnivoice", help="sent as ?model= (realtime transport)")
    a(
        "--transport",
        choices=("realtime", "twilio"),
        default="realtime",
        help="realtime: /v1/realtime events; twilio: each session a Twilio Media Streams call to "
        "/v1/telephony/twilio (u-law 20 ms frames, marks echoed as played)",
    )
    a("--sessions", type=int, default=1, help="concurrent sessions")
    a("--turns", type=int, default=3, help="spoken turns per session")
    a(
        "--client-processes",
        type=int,
        default=0,
        help="client processes the sessions are dealt over, so the client's own JSON, base64 and "
        "WebSocket work does not delay what it measures (0: one per 32 sessions, at most half "
        "this machine's cores)",
    )
    a(
        "--ramp-s",
        type=float,
        default=0.0,
        help="spread the sessions' starts evenly over this many seconds (0: all at once)",
    )
    a("--warmups", type=int, default=1, help="turns of one session run first and left out")
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--speech-text", default=DEFAULT_SPEECH, help="what each caller says (espeak-ng)")
    src.add_argument("--speech-wav", type=Path, default=None, help="a WAV file each caller plays instead")
    a("--silence-ms", type=int, default=500, help="server_vad silence_duration_ms")
    a("--max-output-tokens", type=int, default=None, help="session max_output_tokens")
    a("--audio-frames", type=int, default=None, help="omnivoice only: fixed talker frames per response")
    a(
        "--speculative",
        choices=("both", "on", "off", "server"),
        default="both",
        help="speculative responses (start a turn's response when the speech pauses): a run with them "
        "on, then one off (both), one run (on, off), or one run as the server's profile has it",
    )
    a(
        "--turn-timeout-s",
        type=float,
        default=120.0,
        help="a turn with no response.done (or error) this long after its speech ended counts as "
        "failed ('timeout') and the session goes on to its next turn",
    )
    a("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    a("--output-json", type=Path, default=None, help="write the report as JSON here")
    a("--machine", default=None, help="machine description for the report (default: read off this host)")
    a("--quiet", action="store_true", help="no line per turn on stderr")


def auto_client_processes(sessions: int, cores: int | None = None) -> int:
    """One client process per 32 sessions, at most half the cores (the server needs the rest)."""
    cores = cores or os.cpu_count() or 1
    return max(1, min(cores // 2, math.ceil(sessions / 32)))


def load_speech(args: argparse.Namespace) -> bytes:
    """The caller's clip as 24 kHz pcm16, from --speech-wav or spoken by espeak-ng."""
    if args.speech_wav is not None:
        pcm, rate = decode_wav(args.speech_wav.read_bytes())
    else:
        if shutil.which("espeak-ng") is None:
            raise ValueError("espeak-ng is not installed: install it or pass --speech-wav")
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "speech.wav"
            subprocess.run(["espeak-ng", "-w", str(path), args.speech_text], check=True, capture_output=True)
            pcm, rate = decode_wav(path.read_bytes())
    x = soxr.resample(pcm, rate, RATE) if rate != RATE else pcm
    return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


def summarize(records: list[TurnRecord], duration_s: float) -> dict[str, Any]:
    ok = [r for r in records if r.ok]

    def stats(values: list[float]) -> dict[str, Any]:
        if not values:
            return {"mean": None, "p50": None, "p95": None, "p95_interval": None}
        ms = [1000 * v for v in values]
        interval = percentile_interval(ms, 95)
        return {
            "mean": sum(ms) / len(ms),
            "p50": percentile(ms, 50),
            "p95": percentile(ms, 95),
            # where the p95 of as many turns would fall with other luck (None: too few turns)
            "p95_interval": None if interval is None else list(interval),
        }

    stalls = [playback_stall(r.chunks) for r in ok]
    return {
        "turns": len(ok),
        "errors": len(records) - len(ok),
        "duration_s": duration_s,
        "voice_to_voice_ms": stats([r.first_audio - r.speech_end for r in ok if r.first_audio]),
        "turn_detection_ms": stats([r.stopped - r.speech_end for r in ok if r.stopped]),
        "response_ms": stats([r.first_audio - r.stopped for r in ok if r.first_audio and r.stopped]),
        "max_stall_ms": 1000 * max(stalls) if stalls else None,
        "mean_stall_ms": 1000 * sum(stalls) / len(stalls) if stalls else None,
        "turns_with_stall_over_100ms": sum(s > 0.1 for s in stalls),
        "audio_seconds": sum(s for r in ok for _, s in r.chunks),
        "statuses": {s: sum(r.status == s for r in ok) for s in sorted({r.status or "-" for r in ok})},
        # why each turn that is not ok is not: its error, or the response that ended without audio
        "failures": dict(Counter(failure(r) for r in records if not r.ok).most_common()),
    }


def per_turn(records: list[TurnRecord]) -> list[dict[str, Any]]:
    """Each answered turn's figures in ms, in the order its speech ended (`at_s`: seconds after the
    run's first speech end; the client processes share the host's monotonic clock), so a run's slow
    turns can be placed in time: bunched together, or spread over the run. `response_id` finds the
    server's log line of the response's first audio, with the engine's parts of the wait;
    `input_tokens` and `cached_tokens` its prompt and, of it, what the server had cached."""
    ok = [r for r in records if r.ok]
    if not ok:
        return []
    first = min(r.speech_end for r in ok)

    def ms(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else round(1000 * (a - b), 1)

    return [
        {
            "session": r.session,
            "turn": r.turn,
            "response_id": r.response_id,
            "at_s": round(r.speech_end - first, 3),
            "voice_to_voice_ms": ms(r.first_audio, r.speech_end),
            "turn_detection_ms": ms(r.stopped, r.speech_end),
            "response_ms": ms(r.first_audio, r.stopped),
            "input_tokens": r.input_tokens,
            "cached_tokens": r.cached_tokens,
        }
        for r in sorted(ok, key=lambda r: r.speech_end)
    ]


def failure(r: TurnRecord) -> str:
    """Why a turn has no figures: the error it got, or how its response ended without any audio."""
    if r.error is not None:
        return r.error
    return f"no audio: the response ended {r.status}" if r.status else "no audio: no response ended"


SPECULATION_KEYS = ("started", "confirmed", "dropped", "wasted_tokens", "wasted_audio_seconds")


def speculation_counts(base_url: str, api_key: str | None) -> dict[str, float] | None:
    """The server's speculative-response totals (`/v1/debug/state`), or None if it does not tell."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(f"{base_url.rstrip('/')}/v1/debug/state", headers=headers, timeout=30)
        counts = r.json().get("speculative_responses") if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return {k: counts[k] for k in SPECULATION_KEYS} if isinstance(counts, dict) else None


def _difference(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float] | None:
    if before is None or after is None:
        return None
    return {k: after[k] - before[k] for k in SPECULATION_KEYS}


def client_lag(samples: list[float]) -> dict[str, float] | None:
    """The client processes' event-loop lag in ms (p50, p99, max, and how many samples); None
    without samples."""
    if not samples:
        return None
    return {
        "samples": len(samples),
        "p50": 1e3 * percentile(samples, 50),
        "p99": 1e3 * percentile(samples, 99),
        "max": 1e3 * max(samples),
    }


def format_table(report: dict[str, Any]) -> str:
    head = (
        f"realtime ({report.get('transport', 'realtime')}): {report['sessions']} sessions x "
        f"{report['turns_per_session']} turns, {report['machine']}"
    )
    runs = report.get("runs") or {"-": {"summary": report["summary"], "speculation": None}}
    parts = [head]
    for name, run in runs.items():
        if name != "-":
            parts.append(f"speculative responses: {name}")
        parts.append(_run_table(run["summary"], run["speculation"]))
        if lag := run.get("client_loop_lag_ms"):
            parts.append(
                f"{'client event loop lag ms':<28} p50 {lag['p50']:.1f}, p99 {lag['p99']:.1f}, "
                f"max {lag['max']:.1f} ({lag['samples']} samples)"
            )
        if run.get("server"):
            parts.extend(server_metrics.format_lines(run["server"]))
    return "\n".join(parts)


def _run_table(s: dict[str, Any], speculation: dict[str, float] | None) -> str:
    def row(name: str, s: dict[str, Any]) -> str:
        cells = " / ".join("-" if s[k] is None else f"{s[k]:.0f}" for k in ("mean", "p50", "p95"))
        interval = s.get("p95_interval")
        if interval is not None:
            cells += f"  (p95 90 % interval {interval[0]:.0f}-{interval[1]:.0f})"
        return f"{name:<28} {cells}"

    lines = [
        f"{'turns ok / errors':<28} {s['turns']} / {s['errors']}",
        *(f"  {n} x {why[:90]}" for why, n in list(s.get("failures", {}).items())[:3]),
        "latency ms                   mean / p50 / p95",
        row("voice-to-voice", s["voice_to_voice_ms"]),
        row("  turn detection (VAD)", s["turn_detection_ms"]),
        row("  response (to 1st audio)", s["response_ms"]),
        f"{'max / mean playback stall ms':<28} "
        + " / ".join("-" if s[k] is None else f"{s[k]:.0f}" for k in ("max_stall_ms", "mean_stall_ms")),
        f"{'turns with a stall > 100 ms':<28} {s['turns_with_stall_over_100ms']}",
        f"{'audio received s':<28} {s['audio_seconds']:.1f} in {s['duration_s']:.1f} s",
        f"{'response status':<28} {s['statuses']}",
    ]
    if speculation is not None:
        c = speculation
        counts = " / ".join(f"{c[k]:.0f}" for k in ("started", "confirmed", "dropped"))
        lines.append(f"{'speculative start/conf/drop':<28} {counts}")
        lines.append(
            f"{'  wasted (dropped ones)':<28} {c['wasted_tokens']:.0f} tokens, "
            f"{c['wasted_audio_seconds']:.2f} s of audio"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """0 if at least one measured turn got audio, 1 if none did, 2 on bad options."""
    counts = args.sessions < 1 or args.turns < 1 or args.warmups < 0 or args.client_processes < 0
    if counts or not args.turn_timeout_s > 0:
        print(
            "omnivoice bench realtime: --sessions and --turns must be >= 1, --warmups and "
            "--client-processes >= 0, --turn-timeout-s > 0",
            file=sys.stderr,
        )
        return 2
    try:
        speech = load_speech(args)
    except (ValueError, OSError, subprocess.CalledProcessError) as e:
        print(f"omnivoice bench realtime: {e}", file=sys.stderr)
        return 2
    root = args.base_url.rstrip("/").replace("http", "ws", 1)
    caller: CallerFactory | None = None
    if args.transport == "twilio":
        url, caller = f"{root}/v1/telephony/twilio", TwilioCaller
    else:
        url = f"{root}/v1/realtime?model={args.model}"
    modes: dict[str, bool | None] = {"on": True, "off": False, "server": None}
    if args.speculative != "both":
        modes = {args.speculative: modes[args.speculative]}
    else:
        modes.pop("server")
    common = dict(
        url=url,
        speech=speech,
        silence_ms=args.silence_ms,
        max_output_tokens=args.max_output_tokens,
        audio_frames=args.audio_frames,
        api_key=args.api_key,
        turn_timeout_s=args.turn_timeout_s,
        speculative=next(iter(modes.values())),
    )

    clients = args.client_processes or auto_client_processes(args.sessions)
    print(
        f"realtime bench {url}: {args.sessions} sessions x {args.turns} turns, speech "
        f"{len(speech) / 2 / RATE:.2f} s, {clients} client process(es)",
        file=sys.stderr,
    )
    if args.warmups:
        asyncio.run(
            run_realtime_load(
                RealtimeLoadConfig(sessions=1, turns=args.warmups, **common), lambda r: None, caller
            )
        )
    cfg = RealtimeLoadConfig(sessions=args.sessions, turns=args.turns, ramp_s=args.ramp_s, **common)
    runs: dict[str, dict[str, Any]] = {}
    for name, speculative in modes.items():
        if len(modes) > 1:
            print(f"speculative responses {name}", file=sys.stderr)
        before = speculation_counts(args.base_url, args.api_key)
        scraped = server_metrics.scrape(args.base_url, args.api_key)
        lag = ClientLag()
        records, duration = run_in_processes(
            replace(cfg, speculative=speculative), clients, caller, args.quiet, lag
        )
        after = speculation_counts(args.base_url, args.api_key)
        runs[name] = {
            "summary": summarize(records, duration),
            # how late the client processes' event loops woke (a client behind inflates every figure)
            "client_loop_lag_ms": client_lag(lag.samples),
            "speculation": _difference(before, after),
            "turns": per_turn(records),
            # the event loop's lag and each stage's time over the run, from /metrics around it
            "server": server_metrics.breakdown(
                scraped, server_metrics.scrape(args.base_url, args.api_key), duration
            ),
        }
    report = {
        "kind": "realtime",
        "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "machine": args.machine or describe_machine(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "url": url,
        "transport": args.transport,
        "sessions": args.sessions,
        "client_processes": clients,
        "turns_per_session": args.turns,
        "ramp_s": args.ramp_s,
        "speech_seconds": len(speech) / 2 / RATE,
        "speculative": args.speculative,
        "summary": next(iter(runs.values()))["summary"],  # the first run's (speculative on, by default)
        "runs": runs,
    }
    print(format_table(report))
    if args.output_json is not None:
        args.output_json.parent.mkdir(parents=True, exist_ok=True)
        args.output_json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.output_json}", file=sys.stderr)
    return 0 if all(run["summary"]["turns"] > 0 for run in runs.values()) else 1
