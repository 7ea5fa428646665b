"""`omnivoice bench engine`: the staged engine driven in-process (no HTTP server), then a report.

    omnivoice bench engine --profile configs/h200-dummy.yaml --concurrency 32 --num-prompts 128 \\
        --warmups 5 --prompt-tokens 128 --text-tokens 64 --audio-frames 240 --baseline transformers

Imports nothing of the server stack (starlette, uvicorn, soxr): the GPU machine has none of it.
Torch and transformers are imported only once the run starts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from omnivoice.bench.metrics import RequestRecord, rtf, summarize
from omnivoice.bench.report import build_report, describe_machine, format_table, write_json
from omnivoice.types import StageStats


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `omnivoice bench engine` (argparse only: importing this module stays cheap)."""
    a = parser.add_argument
    a("--profile", required=True, metavar="PATH", help="deploy profile YAML (model.path may be dummy:<name>)")
    a("--concurrency", type=int, nargs="+", default=[1], metavar="N",
      help="requests in flight at once (closed loop); several values run one after another on one engine "
      "start, each reported (and written, with -cN added to the file names) on its own")  # fmt: skip
    a("--num-prompts", type=int, nargs="+", default=[8], metavar="N",
      help="measured requests: one value, or one per --concurrency value")  # fmt: skip
    a("--warmups", type=int, nargs="+", default=[1], metavar="N",
      help="requests run first and left out of the figures: one value, or one per --concurrency")  # fmt: skip
    a("--prompt-tokens", type=int, default=128, help="prompt length: a random user turn in the chat layout")
    a("--text-tokens", type=int, default=64, help="text tokens each request writes (min = max)")
    a(
        "--audio-frames",
        type=int,
        default=240,
        help="codec frames each request writes, 80 ms each (min = max)",
    )
    a("--voice", default="ethan", help="voice of every request")
    a("--seed", type=int, default=0, help="seeds the prompts and each request's sampling")
    a(
        "--baseline",
        choices=("none", "transformers"),
        default="none",
        help="also time transformers' generate() on the same model, batch 1, before the engine starts",
    )
    a("--baseline-requests", type=int, default=2, help="measured generate() calls of the baseline")
    a("--baseline-warmups", type=int, default=1, help="short generate() calls run before the baseline")
    a("--output-json", type=Path, default=None, help="write the report (baseline nested) as JSON here")
    a(
        "--records",
        type=Path,
        default=None,
        help="append each finished request's timings here as a JSON line, as they finish (survives a kill)",
    )
    a("--label", default=None, help="free text stored in the report")
    a("--machine", default=None, help="machine description for the report (default: read off this host)")
    a("--quiet", action="store_true", help="no line per completed request on stderr")


def _check(args: argparse.Namespace) -> None:
    runs = len(args.concurrency)
    for name in ("num_prompts", "warmups"):
        values = getattr(args, name)
        if len(values) not in (1, runs):
            raise ValueError(f"--{name.replace('_', '-')} takes one value or one per --concurrency value")
        setattr(args, name, values * runs if len(values) == 1 else values)
    for name in ("concurrency", "num_prompts", "prompt_tokens", "text_tokens"):
        if min(_values(args, name)) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    for name in ("warmups", "audio_frames", "baseline_requests", "baseline_warmups"):
        if min(_values(args, name)) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0")


def _values(args: argparse.Namespace, name: str) -> list[int]:
    value = getattr(args, name)
    return value if isinstance(value, list) else [value]


def _per_run(path: Path | None, concurrency: int, runs: int) -> Path | None:
    """The output file of one concurrency: `path` itself for a single run, else `stem-cN.suffix`."""
    if path is None or runs == 1:
        return path
    return path.with_name(f"{path.stem}-c{concurrency}{path.suffix}")


def _progress(quiet: bool, records: Path | None):
    def show(phase: str, done: int, total: int, r: RequestRecord) -> None:
        if records is not None:
            with records.open("a") as f:
                f.write(json.dumps({"phase": phase, **asdict(r)}) + "\n")
        if quiet:
            return
        head = f"[{phase} {done:>{len(str(total))}}/{total}]"
        if r.error is not None:
            print(f"{head} error: {r.error}", file=sys.stderr, flush=True)
            return
        parts = [f"{r.text_tokens} tok"]
        if r.first_text is not None:
            parts.append(f"ttft {1000 * (r.first_text - r.t0):.0f} ms")
        if r.first_audio is not None:
            parts.append(f"ttfp {1000 * (r.first_audio - r.t0):.0f} ms")
            parts.append(f"audio {r.audio_seconds:.2f} s, rtf {rtf(r) or 0.0:.3f}")
        if r.end is not None:
            parts.append(f"latency {r.end - r.t0:.2f} s")
        print(f"{head} " + ", ".join(parts), file=sys.stderr, flush=True)

    return show


GRAPHS_WAIT_S = 600.0  # longest wait for the graphs the stages capture after the start


def wait_for_graphs(
    replica_stats: Callable[[], tuple[StageStats, ...]], limit_s: float = GRAPHS_WAIT_S
) -> float | None:
    """Wait until no stage worker has CUDA graphs left to capture after the start (it captures them
    while idle, so a run meanwhile would time the captures too); the seconds waited, or None when none
    was pending. Past `limit_s` it says so and returns."""
    t0 = time.monotonic()
    said = -1
    while True:
        pending = sum(w.graphs_pending for w in replica_stats())
        waited = time.monotonic() - t0
        if not pending:
            return waited if said >= 0 else None
        if waited > limit_s:
            print(f"{pending} graphs still pending after {limit_s:.0f} s; measuring anyway", file=sys.stderr)
            return waited
        if pending != said:
            print(
                f"waiting for {pending} CUDA graphs the stages capture after the start",
                file=sys.stderr,
                flush=True,
            )
            said = pending
        time.sleep(0.2)


def _newline_id(source: Any) -> int:
    from omnivoice.models.dummy import DummySource
    from omnivoice.models.token_prompt import newline_id

    if isinstance(source, DummySource):
        return newline_id(None)
    from transformers import AutoTokenizer

    return newline_id(AutoTokenizer.from_pretrained(source, local_files_only=True))


def _software() -> dict[str, str]:
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__}


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; 0 if at least one measured request succeeded, 1 if none did, 2 on bad options."""
    from omnivoice.bench.engine_load import EngineLoadConfig, run_engine_load
    from omnivoice.config import ProfileError, load_profile

    try:
        _check(args)
        profile = load_profile(args.profile)
    except (ValueError, ProfileError) as e:
        print(f"omnivoice bench engine: {e}", file=sys.stderr)
        return 2
    from omnivoice.engine.engine import Engine
    from omnivoice.engine.loading import resolve_model_path

    runs = len(args.concurrency)
    cfgs = [
        EngineLoadConfig(
            num_prompts=n,
            concurrency=c,
            warmups=w,
            prompt_tokens=args.prompt_tokens,
            text_tokens=args.text_tokens,
            audio_frames=args.audio_frames,
            voice=args.voice,
            seed=args.seed,
        )
        for c, n, w in zip(args.concurrency, args.num_prompts, args.warmups, strict=True)
    ]
    source = resolve_model_path(profile)
    newline = _newline_id(source)
    meta: dict[str, Any] = {
        "label": args.label,
        "machine": args.machine or describe_machine(),
        "model": str(source) if profile.model.path is None else profile.model.path,
        "mode": "engine (in-process, token-id prompts)",
        "profile": str(args.profile),
        "prompt_tokens": args.prompt_tokens,
        "text_tokens_per_request": args.text_tokens,
        "audio_frames_per_request": args.audio_frames,
        "command": shlex.join(["omnivoice", *sys.argv[1:]]),
        **_software(),
    }
    baseline = None
    if args.baseline == "transformers":
        progress = _progress(args.quiet, _per_run(args.records, 1, 1))
        baseline = _run_baseline(profile, source, cfgs[0], args, newline, progress, meta)
        if "error" not in baseline:
            print(format_table(baseline) + "\n", flush=True)

    print(f"starting the engine on {source}", file=sys.stderr, flush=True)
    started = time.perf_counter()
    engine = Engine.start_sync(profile)
    start_s = time.perf_counter() - started
    import torch

    if torch.cuda.is_available():
        gb = torch.cuda.memory_allocated() / 1e9
        print(f"GPU memory allocated after the engine start: {gb:.1f} GB", file=sys.stderr, flush=True)
    print(f"engine ready in {start_s:.1f} s", file=sys.stderr, flush=True)
    waited = wait_for_graphs(engine.replica_stats)
    if waited is not None:
        print(
            f"the stages' graphs for after the start are captured ({waited:.1f} s)",
            file=sys.stderr,
            flush=True,
        )

    async def drive() -> list[Any]:
        results = []
        try:
            for cfg in cfgs:
                print(f"{cfg.num_prompts} requests (+{cfg.warmups} warm-up) at concurrency {cfg.concurrency}",
                      file=sys.stderr, flush=True)  # fmt: skip
                progress = _progress(args.quiet, _per_run(args.records, cfg.concurrency, runs))
                results.append(await run_engine_load(engine, cfg, newline, progress))
        finally:
            await engine.close()
        return results

    measured = 0
    for cfg, result in zip(cfgs, asyncio.run(drive()), strict=True):
        summary = summarize(result.records, result.duration_s)
        measured += summary.requests
        report = build_report(
            summary,
            **meta,
            warmups=cfg.warmups,
            engine=f"omnivoice staged engine ({profile.stages.thinker.execution})",
            concurrency=cfg.concurrency,
            engine_start_s=round(start_s, 2),
        )
        report["stages"] = [asdict(s) for s in result.stages]
        if baseline is not None:
            report["baseline"] = baseline
        print(format_table(report))
        print(_stage_table(report["stages"]))
        out = _per_run(args.output_json, cfg.concurrency, runs)
        if out is not None:
            write_json(report, out)
            print(f"wrote {out}", file=sys.stderr)
    return 0 if measured > 0 else 1


def _run_baseline(profile, source, cfg, args, newline, progress, meta) -> dict[str, Any]:
    from dataclasses import replace

    from omnivoice.bench.baseline import run_transformers_baseline

    base_cfg = replace(cfg, num_prompts=args.baseline_requests, concurrency=1, warmups=args.baseline_warmups)
    print(f"transformers baseline: {base_cfg.num_prompts} generate() calls at batch 1", file=sys.stderr)
    started = time.perf_counter()
    try:
        result = run_transformers_baseline(profile, source, base_cfg, newline, progress)
    except Exception as e:  # the engine run still goes ahead; the report says what failed
        print(f"transformers baseline failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return {"engine": "transformers generate()", "error": f"{type(e).__name__}: {e}"}
    summary = summarize(result.records, result.duration_s)
    return build_report(
        summary,
        **{**meta, "warmups": base_cfg.warmups, "mode": "transformers generate(), batch 1"},
        engine="transformers generate() (batch 1, not streaming)",
        concurrency=1,
        total_s=round(time.perf_counter() - started, 2),
    )


def _stage_table(stages: list[dict[str, Any]]) -> str:
    lines = [f"{'stage':<10}{'steps':>8}{'busy s':>10}{'ms/step':>10}{'batch':>8}"]
    for s in stages:
        ms = "-" if s["mean_step_ms"] is None else f"{s['mean_step_ms']:.1f}"
        batch = "-" if s["mean_batch"] is None else f"{s['mean_batch']:.1f}"
        lines.append(f"{s['name']:<10}{s['steps']:>8}{s['busy_s']:>10.1f}{ms:>10}{batch:>8}")
    return "\n".join(lines)
