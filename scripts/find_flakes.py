#!/usr/bin/env python3
"""Run the test suite several times, optionally beside a CPU hog, and list every test that failed at
least once, with its failure.

A test that passes on a quiet machine and fails on a busy one depends on the machine's speed; CI runs
on a busy 2-core machine, so such a test fails CI by chance. Run this before stopping when tests
changed:

    .venv/bin/python scripts/find_flakes.py --runs 3 --hog -- tests/server -m "slow or not slow"

Arguments after `--` go to pytest (default: the README's test command's selection). Each run's JUnit
XML lands in the output folder; the summary is printed and written as JSON (`flakes.json`). The exit
status is 1 when any test failed in any run, so the script can gate a change.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

DEFAULT_PYTEST_ARGS = ["-m", "slow or not slow"]


@dataclass
class Outcome:
    """What one test did across the runs."""

    nodeid: str
    runs: int = 0
    failures: list[str] = field(default_factory=list)  # one message per failed run


def _spin(stop: multiprocessing.synchronize.Event) -> None:
    """A busy loop: one core's worth of load until `stop` is set."""
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x = (x * 1103515245 + 12345) & 0xFFFFFFFF


@contextmanager
def cpu_hog(cores: int) -> Iterator[None]:
    """Busy loops on `cores` processes for the duration of the block (a `stress --cpu N` without the
    package)."""
    stop = multiprocessing.Event()
    procs = [multiprocessing.Process(target=_spin, args=(stop,), daemon=True) for _ in range(cores)]
    for p in procs:
        p.start()
    try:
        yield
    finally:
        stop.set()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()


def read_junit(path: Path) -> dict[str, str | None]:
    """Each test case in a JUnit XML file: its node id and its failure text (None when it passed or was
    skipped)."""
    out: dict[str, str | None] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        nodeid = f"{classname}::{name}" if classname else name
        failed = case.find("failure")
        if failed is None:
            failed = case.find("error")
        out[nodeid] = None if failed is None else (failed.get("message") or failed.text or "failed")[:2000]
    return out


def tally(runs: list[dict[str, str | None]]) -> list[Outcome]:
    """Per test, how often it ran and each failure; only the tests that failed at least once, the
    most often failing first."""
    by_id: dict[str, Outcome] = {}
    for cases in runs:
        for nodeid, failure in cases.items():
            o = by_id.setdefault(nodeid, Outcome(nodeid))
            o.runs += 1
            if failure is not None:
                o.failures.append(failure)
    failed = [o for o in by_id.values() if o.failures]
    return sorted(failed, key=lambda o: (-len(o.failures), o.nodeid))


def run_once(n: int, out_dir: Path, pytest_args: list[str]) -> tuple[dict[str, str | None], float, int]:
    """One pytest run; its cases, wall seconds and exit status."""
    xml = out_dir / f"run-{n}.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *pytest_args]
    t0 = time.monotonic()
    rc = subprocess.call(cmd)
    took = time.monotonic() - t0
    return (read_junit(xml) if xml.exists() else {}), took, rc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Run the tests N times (optionally beside a CPU hog) and list every test that "
        "failed at least once. Arguments after `--` go to pytest.",
    )
    parser.add_argument("--runs", type=int, default=3, help="how many times to run the suite (3)")
    parser.add_argument(
        "--hog", action="store_true", help="keep every core busy with busy loops while the tests run"
    )
    parser.add_argument(
        "--hog-cores", type=int, default=os.cpu_count() or 2, help="busy loops with --hog (all cores)"
    )
    parser.add_argument("--out", type=Path, default=Path("flakes"), help="folder for JUnit XML and JSON")
    args, rest = parser.parse_known_args(argv)
    pytest_args = rest[1:] if rest[:1] == ["--"] else rest
    pytest_args = pytest_args or DEFAULT_PYTEST_ARGS
    args.out.mkdir(parents=True, exist_ok=True)

    runs, walls = [], []
    for n in range(1, args.runs + 1):
        hogging = f" beside {args.hog_cores} busy loops" if args.hog else ""
        print(f"==> run {n} of {args.runs}{hogging}: pytest {' '.join(pytest_args)}", flush=True)
        if args.hog:
            with cpu_hog(args.hog_cores):
                cases, took, rc = run_once(n, args.out, pytest_args)
        else:
            cases, took, rc = run_once(n, args.out, pytest_args)
        if not cases and rc not in (0, 1):
            print(f"run {n}: pytest exited {rc} without a report (collection error?)", file=sys.stderr)
            return rc
        runs.append(cases)
        walls.append(round(took, 1))
        print(
            f"    run {n}: {len(cases)} tests, {sum(v is not None for v in cases.values())} failed, "
            f"{took:.0f} s",
            flush=True,
        )

    flaky = tally(runs)
    report = {
        "runs": args.runs,
        "hog": args.hog,
        "pytest_args": pytest_args,
        "wall_s": walls,
        "failed": [asdict(o) for o in flaky],
    }
    (args.out / "flakes.json").write_text(json.dumps(report, indent=2))
    if not flaky:
        print(f"no test failed in {args.runs} runs")
        return 0
    print(f"{len(flaky)} tests failed at least once:")
    for o in flaky:
        print(f"  {o.nodeid}: failed {len(o.failures)} of {o.runs}")
        print("      " + o.failures[0].splitlines()[0][:300] if o.failures[0] else "")
    return 1


if __name__ == "__main__":
    sys.exit(main())
