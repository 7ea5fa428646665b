"""`omnivoice bench parity`: graphed and eager execution must give identical greedy tokens and codes.

The thinker and talker runners of a profile are built once (with `execution: cuda_graph` their graphs
are captured at build). The same greedy requests then run through them twice, graphs off and on,
driven by one deterministic synchronous loop, so both runs batch the same rows in the same order and
any difference comes from the graphs alone. Text token ids and codec frames are compared exactly.

    omnivoice bench parity --profile configs/h200-dummy.yaml --requests 4 --text-tokens 64 --audio-frames 120
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--profile", required=True, metavar="PATH", help="deploy profile YAML (model.path may be dummy:<name>)")
    a("--requests", type=int, default=4, help="greedy requests, run as one batch")
    a("--prompt-tokens", type=int, default=64, help="prompt length of each request")
    a("--text-tokens", type=int, default=32, help="text tokens each request writes")
    a("--audio-frames", type=int, default=64, help="codec frames each request writes")
    a("--seed", type=int, default=0, help="seeds the prompts")
    a("--output-json", type=Path, default=None, help="write the comparison as JSON here")


@dataclass
class RunOutput:
    tokens: dict[str, list[int]]
    frames: dict[str, np.ndarray]  # [G, frames] per request
    seconds: float
    thinker_steps: int
    talker_steps: int


def graph_steps(runner: Any) -> list[Any]:
    """The StepGraphs of a thinker or talker runner (their `enabled` switches graphs on and off)."""
    steps = [runner.decode_step.graphs]
    predictor = getattr(runner, "predictor", None)
    if predictor is not None:
        steps.append(predictor.run)
    return steps


def drive(thinker: Any, talker: Any, requests: list[Any]) -> RunOutput:
    """Run `requests` through the two runners to the end, in one fixed order of steps."""
    from omnivoice.engine.chunks import CodecChunk, NewRequest, ThinkerChunk, TokenOutput

    tokens: dict[str, list[int]] = defaultdict(list)
    frames: dict[str, list[np.ndarray]] = defaultdict(list)
    steps = [0, 0]
    began = time.perf_counter()
    for request in requests:
        thinker.accept(NewRequest(request))
    while thinker.has_work() or talker.has_work():
        if thinker.has_work():
            steps[0] += 1
            for out in thinker.step():
                if isinstance(out, TokenOutput):
                    tokens[out.request_id] += out.token_ids
                elif isinstance(out, ThinkerChunk):
                    talker.accept(out)
        if talker.has_work():
            steps[1] += 1
            for out in talker.step():
                if isinstance(out, CodecChunk) and out.frames.shape[1]:
                    frames[out.request_id].append(np.asarray(out.frames))
    joined = {rid: np.concatenate(f, axis=1) for rid, f in frames.items()}
    return RunOutput(dict(tokens), joined, time.perf_counter() - began, *steps)


def compare(a: RunOutput, b: RunOutput) -> dict[str, Any]:
    """Per request: do the token ids and the frames match exactly, and where do they first differ."""
    rows = []
    for rid in sorted(set(a.tokens) | set(b.tokens)):
        ta, tb = a.tokens.get(rid, []), b.tokens.get(rid, [])
        fa = a.frames.get(rid, np.zeros((0, 0), dtype=np.int64))
        fb = b.frames.get(rid, np.zeros((0, 0), dtype=np.int64))
        first_token = next((i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y), None)
        same_frames = fa.shape == fb.shape and bool((fa == fb).all())
        first_frame = None
        if not same_frames and fa.ndim == fb.ndim == 2:
            n = min(fa.shape[1], fb.shape[1])
            diff = np.nonzero((fa[:, :n] != fb[:, :n]).any(axis=0))[0]
            first_frame = int(diff[0]) if len(diff) else n
        rows.append(
            {
                "request": rid,
                "tokens": len(ta),
                "frames": int(fa.shape[1]) if fa.ndim == 2 else 0,
                "tokens_equal": ta == tb,
                "first_token_difference": first_token,
                "frames_equal": same_frames,
                "first_frame_difference": first_frame,
            }
        )
    return {"identical": all(r["tokens_equal"] and r["frames_equal"] for r in rows), "requests": rows}


def run(args: argparse.Namespace) -> int:
    from omnivoice.bench.engine_cli import _newline_id, _software
    from omnivoice.bench.engine_load import EngineLoadConfig, make_requests
    from omnivoice.bench.report import describe_machine, write_json
    from omnivoice.config import ProfileError, load_profile
    from omnivoice.engine.source import resolve_model_path
    from omnivoice.runners.factory import build_runners

    try:
        profile = load_profile(args.profile)
        if min(args.requests, args.prompt_tokens, args.text_tokens) < 1 or args.audio_frames < 0:
            raise ValueError("--requests, --prompt-tokens, --text-tokens must be >= 1; --audio-frames >= 0")
    except (ValueError, ProfileError) as e:
        print(f"omnivoice bench parity: {e}", file=sys.stderr)
        return 2
    stages = profile.stages
    greedy = {
        name: stages.stage(name).model_copy(
            update={"sampling": stages.stage(name).sampling.model_copy(update={"temperature": 0.0})}
        )
        for name in ("thinker", "talker")
    }
    profile = profile.model_copy(update={"stages": stages.model_copy(update=greedy)})
    source = resolve_model_path(profile)
    print(f"building the thinker and talker runners of {source}", file=sys.stderr, flush=True)
    began = time.perf_counter()
    runners = build_runners(profile, source, only=(("thinker", 0), ("talker", 0)))
    thinker, talker = runners[("thinker", 0)], runners[("talker", 0)]
    build_s = time.perf_counter() - began
    cfg = EngineLoadConfig(
        num_prompts=args.requests,
        concurrency=args.requests,
        warmups=0,
        prompt_tokens=args.prompt_tokens,
        text_tokens=args.text_tokens,
        audio_frames=args.audio_frames,
        seed=args.seed,
    )
    requests = make_requests(profile, thinker.spec, cfg, _newline_id(source), args.requests, "parity")
    graphed = stages.thinker.execution == "cuda_graph" or stages.talker.execution == "cuda_graph"
    outputs: dict[str, RunOutput] = {}
    for mode in ("eager", "graphed") if graphed else ("eager", "eager again"):
        for step in graph_steps(thinker) + graph_steps(talker):
            step.enabled = mode == "graphed" and step.pool is not None
        outputs[mode] = drive(thinker, talker, requests)
        o = outputs[mode]
        print(
            f"{mode}: {o.thinker_steps} thinker and {o.talker_steps} talker steps in {o.seconds:.2f} s",
            file=sys.stderr,
            flush=True,
        )
    first, second = outputs.values()
    result = compare(first, second)
    report = {
        "machine": describe_machine(),
        "profile": str(args.profile),
        "model": str(source),
        "modes": list(outputs),
        "runner_build_s": round(build_s, 2),
        "seconds": {mode: round(o.seconds, 3) for mode, o in outputs.items()},
        "steps": {mode: [o.thinker_steps, o.talker_steps] for mode, o in outputs.items()},
        **_software(),
        **result,
    }
    for r in result["requests"]:
        state = "identical" if r["tokens_equal"] and r["frames_equal"] else "DIFFERENT"
        print(f"{r['request']}: {r['tokens']} tokens, {r['frames']} frames: {state}")
    print(json.dumps({k: report[k] for k in ("modes", "seconds", "identical")}))
    if args.output_json is not None:
        write_json(report, args.output_json)
    return 0 if result["identical"] else 1
