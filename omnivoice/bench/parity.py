"""`omnivoice bench parity`: graphed and eager execution must give identical tokens, codes and audio.

The thinker, talker and code2wav runners of a profile are built once (with `execution: cuda_graph`
their graphs are captured at build). The same greedy requests then run through them twice, graphs off
and on, driven by one deterministic synchronous loop, so both runs batch the same rows in the same
order and any difference comes from the graphs alone. Text token ids and codec frames are compared
exactly, and so is the streamed PCM (`--pcm-atol` allows a tolerance); chunks keep their configured
sizes (no `catch_up`), so timing cannot move their boundaries.

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

from omnivoice.types import STAGES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--profile", required=True, metavar="PATH", help="deploy profile YAML (model.path may be dummy:<name>)")
    a("--requests", type=int, default=4, help="greedy requests, run as one batch")
    a("--prompt-tokens", type=int, default=64, help="prompt length of each request")
    a("--text-tokens", type=int, default=32, help="text tokens each request writes")
    a("--audio-frames", type=int, default=64, help="codec frames each request writes")
    a("--seed", type=int, default=0, help="seeds the prompts")
    a("--pcm-atol", type=float, default=0.0, help="largest PCM difference still counted as equal")
    a("--output-json", type=Path, default=None, help="write the comparison as JSON here")


@dataclass
class RunOutput:
    tokens: dict[str, list[int]]
    frames: dict[str, np.ndarray]  # [G, frames] per request
    pcm: dict[str, np.ndarray]  # [samples] per request (empty without a code2wav runner)
    seconds: float
    steps: tuple[int, int, int]  # thinker, talker, code2wav
    step_seconds: tuple[float, float, float]  # time inside each runner's step()


def graph_steps(runner: Any) -> list[Any]:
    """The StepGraphs of a thinker, talker or code2wav runner (`enabled` switches graphs on and off)."""
    from omnivoice.runners.code2wav import Code2WavRunner

    if isinstance(runner, Code2WavRunner):
        return [runner.vocoder.graphs]
    steps = [runner.decode_step.graphs]
    predictor = getattr(runner, "predictor", None)
    if predictor is not None:
        steps += [predictor.run, runner.sample_graphs]  # the talker's
    return steps


def drive(thinker: Any, talker: Any, requests: list[Any], code2wav: Any = None) -> RunOutput:
    """Run `requests` through the runners to the end, in one fixed order of steps."""
    from omnivoice.messages import CodecChunk, NewRequest, PcmOutput, ThinkerChunk, TokenOutput

    tokens: dict[str, list[int]] = defaultdict(list)
    frames: dict[str, list[np.ndarray]] = defaultdict(list)
    pcm: dict[str, list[np.ndarray]] = defaultdict(list)
    runners = (thinker, talker, code2wav)
    steps = [0, 0, 0]
    seconds = [0.0, 0.0, 0.0]

    def step(i: int) -> list[Any]:
        steps[i] += 1
        began = time.perf_counter()
        outs = runners[i].step()
        seconds[i] += time.perf_counter() - began
        return outs

    began = time.perf_counter()
    for request in requests:
        thinker.accept(NewRequest(request))
    while any(r is not None and r.has_work() for r in runners):
        if thinker.has_work():
            for out in step(0):
                if isinstance(out, TokenOutput):
                    tokens[out.request_id] += out.token_ids
                elif isinstance(out, ThinkerChunk):
                    talker.accept(out)
        if talker.has_work():
            for out in step(1):
                if isinstance(out, CodecChunk):
                    if out.frames.shape[1]:
                        frames[out.request_id].append(np.asarray(out.frames))
                    if code2wav is not None:
                        code2wav.accept(out)
        if code2wav is not None and code2wav.has_work():
            for out in step(2):
                if isinstance(out, PcmOutput):
                    pcm[out.request_id].append(out.pcm)
    return RunOutput(
        dict(tokens),
        {rid: np.concatenate(f, axis=1) for rid, f in frames.items()},
        {rid: np.concatenate(p) for rid, p in pcm.items()},
        time.perf_counter() - began,
        (steps[0], steps[1], steps[2]),
        (seconds[0], seconds[1], seconds[2]),
    )


def compare_pcm(a: np.ndarray | None, b: np.ndarray | None, atol: float = 0.0) -> dict[str, Any]:
    """Do two streams of PCM match (same length, every sample within `atol`), and where not."""
    if a is None and b is None:
        return {"pcm_samples": 0, "pcm_equal": True, "pcm_max_abs_diff": 0.0, "first_pcm_difference": None}
    a = np.zeros(0, np.float32) if a is None else a
    b = np.zeros(0, np.float32) if b is None else b
    n = min(a.shape[0], b.shape[0])
    diff = np.abs(a[:n].astype(np.float64) - b[:n])
    beyond = np.nonzero(diff > atol)[0]
    first = int(beyond[0]) if len(beyond) else (None if a.shape == b.shape else n)
    return {
        "pcm_samples": int(a.shape[0]),
        "pcm_equal": first is None,
        "pcm_max_abs_diff": float(diff.max()) if n else 0.0,
        "first_pcm_difference": first,
    }


def compare(a: RunOutput, b: RunOutput, pcm_atol: float = 0.0) -> dict[str, Any]:
    """Per request: do the token ids, the frames and the PCM match (exactly, or PCM within `pcm_atol`),
    and where do they first differ."""
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
                **compare_pcm(a.pcm.get(rid), b.pcm.get(rid), pcm_atol),
            }
        )
    identical = all(r["tokens_equal"] and r["frames_equal"] and r["pcm_equal"] for r in rows)
    return {"identical": identical, "requests": rows}


def run(args: argparse.Namespace) -> int:
    from omnivoice.bench.engine_cli import _newline_id, _software
    from omnivoice.bench.engine_load import EngineLoadConfig, make_requests
    from omnivoice.bench.report import describe_machine, write_json
    from omnivoice.config import ProfileError, load_profile
    from omnivoice.engine.loading import resolve_model_path
    from omnivoice.runners.factory import build_runners

    try:
        profile = load_profile(args.profile)
        if min(args.requests, args.prompt_tokens, args.text_tokens) < 1 or args.audio_frames < 0:
            raise ValueError("--requests, --prompt-tokens, --text-tokens must be >= 1; --audio-frames >= 0")
        if args.pcm_atol < 0:
            raise ValueError("--pcm-atol must be >= 0")
    except (ValueError, ProfileError) as e:
        print(f"omnivoice bench parity: {e}", file=sys.stderr)
        return 2
    stages = profile.stages
    fixed = {
        name: stages.stage(name).model_copy(
            update={"sampling": stages.stage(name).sampling.model_copy(update={"temperature": 0.0})}
        )
        for name in ("thinker", "talker")
    }
    # Chunk boundaries must not depend on timing: catch_up cuts a chunk short when its frames come
    # slowly, and a chunk decoded with other boundaries gives other float rounding at its edges.
    code2wav_cfg = stages.code2wav
    fixed["code2wav"] = code2wav_cfg.model_copy(
        update={"chunk": code2wav_cfg.chunk.model_copy(update={"catch_up": False})}
    )
    profile = profile.model_copy(update={"stages": stages.model_copy(update=fixed)})
    source = resolve_model_path(profile)
    print(f"building the thinker, talker and code2wav runners of {source}", file=sys.stderr, flush=True)
    began = time.perf_counter()
    runners = build_runners(profile, source, only=tuple((s, 0) for s in STAGES))
    thinker, talker, code2wav = (runners[(s, 0)] for s in STAGES)
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
    graphed = any(stages.stage(s).execution == "cuda_graph" for s in STAGES)
    outputs: dict[str, RunOutput] = {}
    for mode in ("eager", "graphed") if graphed else ("eager", "eager again"):
        for step in graph_steps(thinker) + graph_steps(talker) + graph_steps(code2wav):
            step.enabled = mode == "graphed" and step.pool is not None
        outputs[mode] = o = drive(thinker, talker, requests, code2wav)
        counts = ", ".join(
            f"{n} {name} steps ({s:.2f} s)"
            for name, n, s in zip(STAGES, o.steps, o.step_seconds, strict=True)
        )
        print(f"{mode}: {counts}; {o.seconds:.2f} s in all", file=sys.stderr, flush=True)
    first, second = outputs.values()
    result = compare(first, second, args.pcm_atol)
    report = {
        "machine": describe_machine(),
        "profile": str(args.profile),
        "model": str(source),
        "modes": list(outputs),
        "runner_build_s": round(build_s, 2),
        "seconds": {mode: round(o.seconds, 3) for mode, o in outputs.items()},
        "steps": {mode: list(o.steps) for mode, o in outputs.items()},
        "step_seconds": {mode: [round(t, 3) for t in o.step_seconds] for mode, o in outputs.items()},
        "pcm_atol": args.pcm_atol,
        **_software(),
        **result,
    }
    for r in result["requests"]:
        same = {"tokens": r["tokens_equal"], "frames": r["frames_equal"], "pcm": r["pcm_equal"]}
        differ = [k for k, v in same.items() if not v]
        state = "DIFFERENT: " + ", ".join(differ) if differ else "identical"
        print(
            f"{r['request']}: {r['tokens']} tokens, {r['frames']} frames, {r['pcm_samples']} samples "
            f"(max |PCM difference| {r['pcm_max_abs_diff']:.3g}): {state}"
        )
    print(json.dumps({k: report[k] for k in ("modes", "seconds", "identical")}))
    if args.output_json is not None:
        write_json(report, args.output_json)
    return 0 if result["identical"] else 1
