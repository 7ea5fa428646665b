"""The slowest turns of a `bench realtime` run, each with where its engine request's wait went.

A development tool for the GPU runs (not part of the package):

    python benchmarks/slow_turns.py rt-s32.json serve.log --top 8

`bench realtime` lists a run's answered turns (`runs.<mode>.turns`: session, turn, the seconds after
the run's first speech end that its speech ended, voice-to-voice, turn detection and response ms, and
the response that answered it, with its prompt's tokens and how many of them the server had cached);
the server logs each response's first audio with the engine's parts
of the wait (server/session/response.py). This joins the two: the `--top` slowest turns by
voice-to-voice with their parts, then how the turns over `--slow-ms` spread over the turn index and
over the run's time, so a tail can be told apart as bunched (one moment of the run, one turn index)
or spread. `--json` writes the same as JSON.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

LINE = re.compile(
    r"response (?P<id>resp_\w+): the engine's first audio (?P<after>\d+) ms after the response began; "
    r"its wait from the request's start: (?P<parts>.*)$"
)
PART = re.compile(r"(\w+) (-?\d+) ms")  # a part can come out below 0: the hand-offs overlap


def logged_parts(log: str) -> dict[str, dict[str, float]]:
    """Each response's logged first audio: response id -> {"after": ms, part: ms, ...}."""
    out: dict[str, dict[str, float]] = {}
    for line in log.splitlines():
        m = LINE.search(line)
        if m is not None:
            parts = {name: float(ms) for name, ms in PART.findall(m["parts"])}
            out[m["id"]] = {"after": float(m["after"]), **parts}
    return out


def slow_turns(
    report: dict[str, Any], log: str, top: int, slow_ms: float, mode: str | None
) -> dict[str, Any]:
    """The run's slowest turns joined with the log, and where its slow turns fall."""
    runs = report.get("runs") or {}
    if not runs:
        raise ValueError("the report has no runs (not a `bench realtime` JSON)")
    name = mode or next(iter(runs))
    if name not in runs:
        raise ValueError(f"the report has no run {name!r} (it has {', '.join(runs)})")
    turns = runs[name].get("turns")
    if turns is None:
        raise ValueError("the report lists no turns (a `bench realtime` older than its per-turn list)")
    parts = logged_parts(log)
    timed = [t for t in turns if t.get("voice_to_voice_ms") is not None]
    slowest = sorted(timed, key=lambda t: t["voice_to_voice_ms"], reverse=True)[:top]
    slow = [t for t in timed if t["voice_to_voice_ms"] > slow_ms]
    span = max((t["at_s"] for t in timed), default=0.0)
    tenths = Counter(min(9, int(10 * t["at_s"] / span)) if span > 0 else 0 for t in slow)
    return {
        "run": name,
        "turns": len(timed),
        "slow_ms": slow_ms,
        "slowest": [{**t, "engine": parts.get(t.get("response_id") or "")} for t in slowest],
        "slow_by_turn": dict(sorted(Counter(t["turn"] for t in slow).items())),
        # the slow turns in each tenth of the run's span of speech ends (0: its first tenth)
        "slow_by_tenth": [tenths.get(i, 0) for i in range(10)],
        "span_s": span,
        "logged": sum(1 for t in timed if t.get("response_id") in parts),
    }


def format_text(r: dict[str, Any]) -> str:
    lines = [
        f"run {r['run']}: {r['turns']} turns, {r['logged']} with the engine's parts in the log",
        "session turn   at s   v2v ms  detect  response  prompt (cached)  engine parts (ms, from the "
        "request's start)",
    ]
    for t in r["slowest"]:
        engine = t["engine"]
        where = (
            "not in the log"
            if engine is None
            else "  ".join(f"{k} {v:.0f}" for k, v in engine.items() if k != "after")
        )
        prompt = (
            "-" if t.get("input_tokens") is None else f"{t['input_tokens']} ({t.get('cached_tokens', 0)})"
        )
        lines.append(
            f"{t['session']:>7} {t['turn']:>4} {t['at_s']:>6.1f} {t['voice_to_voice_ms']:>8.0f} "
            f"{_ms(t['turn_detection_ms']):>7} {_ms(t['response_ms']):>9}  {prompt:>15}  {where}"
        )
    lines.append(f"turns over {r['slow_ms']:.0f} ms by turn index: {r['slow_by_turn'] or 'none'}")
    lines.append(f"... by tenth of the run's {r['span_s']:.1f} s of speech ends: {r['slow_by_tenth']}")
    return "\n".join(lines)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("report", type=Path, help="a `bench realtime --output-json` file")
    p.add_argument("log", type=Path, help="the server's log over that run")
    p.add_argument("--top", type=int, default=8, help="the slowest turns listed (default 8)")
    p.add_argument(
        "--slow-ms", type=float, default=350.0, help="a turn slower than this is slow (default 350)"
    )
    p.add_argument("--mode", default=None, help="the run of the report (on, off; default its first)")
    p.add_argument("--json", type=Path, default=None, help="also write the result as JSON here")
    args = p.parse_args(argv)
    if args.top < 1:
        p.error("--top must be >= 1")
    try:
        report = json.loads(args.report.read_text())
        result = slow_turns(report, args.log.read_text(errors="replace"), args.top, args.slow_ms, args.mode)
    except (OSError, ValueError) as e:
        print(f"slow_turns: {e}", file=sys.stderr)
        return 2
    print(format_text(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
