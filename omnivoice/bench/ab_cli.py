"""`omnivoice bench ab REV_A REV_B`: serve two git revisions alternately and compare one workload.

Each revision is unpacked into its own temporary directory; each run starts that revision's server
(this Python, its tree on PYTHONPATH, a free loopback port), runs the workload's client against it
(always this tree's `omnivoice bench` or `omnivoice bench realtime`) and stops the server, so only one
is up at a time. Runs go A B B A A B ...; the report is the ratio of means B/A per metric with a
bootstrap interval and the range of the per-round ratios, printed and written as JSON.

Exit codes, for `git bisect run`: 0 done (and within --fail-above), 1 the gated ratio is above
--fail-above, 125 revision B cannot be served or measured (bisect skips it), 128 revision A cannot
(bisect stops), 2 bad options.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from omnivoice.bench.ab_serve import (
    Revision,
    ServeError,
    check_import,
    group_cpu_by_process,
    materialise,
    serving,
)
from omnivoice.bench.ab_stats import Comparison, RunRecord, compare, schedule
from omnivoice.bench.ab_workload import (
    METRICS,
    SERVER_CPU,
    WORKLOADS,
    failed_share,
    read_metrics,
    run_client,
)
from omnivoice.bench.report import describe_machine

EXIT_ABOVE, EXIT_USAGE, EXIT_SKIP, EXIT_ABORT = 1, 2, 125, 128
GATES = {"chat": "latency_ms", "realtime": "voice_to_voice_ms"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `omnivoice bench ab`."""
    a = parser.add_argument
    a("rev_a", metavar="REV_A", help="the reference revision (a commit, tag or branch)")
    a("rev_b", metavar="REV_B", help="the revision compared with it (e.g. HEAD under git bisect run)")
    a("--workload", choices=WORKLOADS, default="chat", help="chat: omnivoice bench; realtime: bench realtime")
    a("--runs", type=int, default=3, help="runs of each revision (rounds of the alternation)")
    a(
        "--profile",
        default=None,
        help="deploy profile for both servers; a relative path is read in each "
        "revision's own tree (default: the built-in CPU profile)",
    )
    for side in ("a", "b"):
        a(
            f"--profile-{side}",
            default=None,
            help=f"deploy profile for {side.upper()}'s server alone, instead of --profile (e.g. to "
            "turn off in the newer revision a default the older one lacks, that would change the load)",
        )
    a("--repo", type=Path, default=Path("."), help="the git repository the revisions are read from")
    a("--fail-above", type=float, default=None, help="exit 1 if the gated ratio B/A is above this")
    a(
        "--gate",
        default=None,
        help="the metric --fail-above looks at (default: latency_ms for chat, "
        "voice_to_voice_ms for realtime)",
    )
    a("--ready-timeout", type=float, default=600.0, help="seconds a server may take to become ready")
    a("--client-timeout", type=float, default=1800.0, help="seconds one workload run may take")
    a(
        "--work-dir",
        type=Path,
        default=None,
        help="keep the trees, logs and client reports here "
        "(default: a temporary directory, removed at the end)",
    )
    a("--output-json", type=Path, default=None, help="write the comparison and every run here")
    parser.set_defaults(client_args=[])  # `omnivoice bench ab ... -- OPTIONS`: the client's options
    parser.epilog = (
        "Options after a lone -- go to the workload's client (omnivoice bench, or omnivoice bench "
        "realtime), e.g. -- --concurrency 1 --num-prompts 8 --warmups 2."
    )


def _client_args(args: argparse.Namespace) -> list[str]:
    return list(args.client_args)


def side_profile(args: argparse.Namespace, side: str) -> str | None:
    """The profile side "A" or "B" serves: its own --profile-a / --profile-b, else --profile."""
    own: str | None = getattr(args, f"profile_{side.lower()}")
    return own if own is not None else args.profile


def _progress(text: str) -> None:
    print(f"[ab {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _one_run(
    args: argparse.Namespace, rev: Revision, rnd: int, side: str, pos: int, work: Path
) -> tuple[RunRecord, dict[str, Any]]:
    """Serve `rev`, run the workload once, stop it. ServeError propagates: the revision cannot run."""
    tag = f"{pos:02d}-{side}-{rev.commit[:8]}"
    t0 = time.monotonic()
    info: dict[str, Any] = {"commit": rev.commit}
    log = work / f"{tag}.server.log"
    with serving(rev, log, side_profile(args, side), ready_timeout_s=args.ready_timeout) as server:
        url = server.url
        info["ready_s"] = round(time.monotonic() - t0, 1)
        cpu_before = group_cpu_by_process(server.pid)
        _progress(f"  {side} ready in {info['ready_s']} s on {url}; running the {args.workload} workload")
        try:
            report = run_client(
                args.workload,
                url,
                work / f"{tag}.json",
                _client_args(args),
                work / f"{tag}.client.log",
                args.client_timeout,
            )
        except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError) as e:
            return RunRecord(side, rnd, pos, error=f"{type(e).__name__}: {e}"), info
        cpu_after = group_cpu_by_process(server.pid)
    # per process, in start order (server, then its stage processes): which stage the time went to
    info["cpu_by_process"] = {
        pid: round(t - cpu_before.get(pid, 0.0), 2) for pid, t in sorted(cpu_after.items())
    }
    cpu = sum(info["cpu_by_process"].values())
    info["client_report"] = report
    metrics = {**read_metrics(args.workload, report), SERVER_CPU: cpu}
    record = RunRecord(side, rnd, pos, metrics, failed_share(args.workload, report))
    return record, info


def _run_line(record: RunRecord) -> str:
    if not record.ok:
        return f"  {record.side} failed: {record.error}"
    figures = ", ".join(f"{k} {v:.2f}" for k, v in record.metrics.items() if v is not None)
    return f"  {record.side}: {figures}"


def format_table(workload: str, comparisons: list[Comparison]) -> str:
    """Means, ratio B/A, its 90 % bootstrap interval and the range of per-round ratios, one metric a row."""
    lines = [f"{'metric':<22}{'A mean':>10}{'B mean':>10}{'B/A':>8}{'90% interval':>16}{'per round':>16}"]
    for c in comparisons:
        title = METRICS[workload][c.metric][0]
        paired = "-" if c.paired_min is None else f"{c.paired_min:.3f}..{c.paired_max:.3f}"
        interval = f"{c.ci_low:.3f}..{c.ci_high:.3f}"
        lines.append(
            f"{title:<22}{c.mean_a:>10.1f}{c.mean_b:>10.1f}{c.ratio:>8.3f}{interval:>16}{paired:>16}"
        )
    return "\n".join(lines)


def _verdict(args: argparse.Namespace, comparisons: dict[str, Comparison]) -> int:
    if args.fail_above is None:
        return 0
    gate = comparisons.get(args.gate)
    if gate is None:
        _progress(f"no {args.gate} from both revisions: cannot judge B")
        return EXIT_SKIP
    above = gate.ratio > args.fail_above
    _progress(f"{args.gate} B/A {gate.ratio:.3f} {'>' if above else '<='} {args.fail_above}")
    return EXIT_ABOVE if above else 0


def _measure(args: argparse.Namespace, work: Path) -> int:
    revs = {
        side: materialise(args.repo, name, work / "trees")
        for side, name in (("A", args.rev_a), ("B", args.rev_b))
    }
    for side, rev in revs.items():
        _progress(f"{side} = {rev.name} ({rev.commit[:12]}) in {rev.tree}")
    records: list[RunRecord] = []
    infos: list[dict[str, Any]] = []
    order = schedule(args.runs)
    for pos, (rnd, side) in enumerate(order):
        rev = revs[side]
        _progress(
            f"run {pos + 1}/{len(order)}: {side} ({rev.commit[:8]}), round {rnd + 1}: starting its server"
        )
        try:
            check_import(rev.tree)
            record, info = _one_run(args, rev, rnd, side, pos, work)
        except ServeError as e:
            _progress(f"{side} ({rev.name}) cannot be served: {e}")
            return EXIT_SKIP if side == "B" else EXIT_ABORT
        records.append(record)
        infos.append(info)
        _progress(_run_line(record))
    comparisons = {m: c for m in METRICS[args.workload] if (c := compare(records, m)) is not None}
    print(
        f"A = {args.rev_a} ({revs['A'].commit[:12]}), B = {args.rev_b} ({revs['B'].commit[:12]}), "
        f"{args.runs} runs each, {args.workload} workload"
    )
    print(format_table(args.workload, list(comparisons.values())))
    if args.output_json is not None:
        _write(args, revs, records, infos, comparisons)
    return _verdict(args, comparisons)


def _write(
    args: argparse.Namespace,
    revs: dict[str, Revision],
    records: list[RunRecord],
    infos: list[dict[str, Any]],
    comparisons: dict[str, Comparison],
) -> None:
    report = {
        "kind": "ab",
        "command": shlex.join(["omnivoice", *sys.argv[1:]]),
        "machine": describe_machine(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "workload": args.workload,
        "profile": args.profile,
        "profiles": {side: side_profile(args, side) for side in ("A", "B")},
        "client_args": _client_args(args),
        "a": {"name": args.rev_a, "commit": revs["A"].commit},
        "b": {"name": args.rev_b, "commit": revs["B"].commit},
        "order": [f"{r.side}{r.round}" for r in records],
        "comparisons": {m: asdict(c) for m, c in comparisons.items()},
        "runs": [{**asdict(r), **info} for r, info in zip(records, infos, strict=True)],
    }
    args.output_json.parent.mkdir(parents=True, exist_ok=True)
    args.output_json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output_json}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    """Run the A/B benchmark; the exit code is described in the module docstring."""
    args.gate = args.gate or GATES[args.workload]
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per /health poll
    # SIGTERM (a stopped bisect) unwinds like Ctrl-C, so the server running then is stopped too
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.runs < 1:
        print("omnivoice bench ab: --runs must be >= 1", file=sys.stderr)
        return EXIT_USAGE
    if args.gate not in METRICS[args.workload]:
        print(
            f"omnivoice bench ab: --gate must be one of {', '.join(METRICS[args.workload])}", file=sys.stderr
        )
        return EXIT_USAGE
    args.repo = args.repo.resolve()
    try:
        if args.work_dir is not None:
            args.work_dir = args.work_dir.resolve()  # the client runs in another directory
            args.work_dir.mkdir(parents=True, exist_ok=True)
            return _measure(args, args.work_dir)
        with tempfile.TemporaryDirectory(prefix="omnivoice-ab-") as tmp:
            return _measure(args, Path(tmp))
    except ValueError as e:
        print(f"omnivoice bench ab: {e}", file=sys.stderr)
        return EXIT_USAGE
