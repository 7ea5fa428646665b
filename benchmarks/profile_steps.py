"""Where a decode step's time goes: per-stage step times, graph replay alone, and torch.profiler tables.

A development tool for the GPU runtime (not part of the package):

    python benchmarks/profile_steps.py --profile configs/h200-dummy.yaml --batch 1 32 --out /tmp/prof

Builds the thinker, talker and code2wav runners of the profile, starts `batch` requests, then times
steps of each stage alone (no other stage running), the bare CUDA-graph replays, and writes the
profiler's kernel and operator tables.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity
from torch.profiler import profile as torch_profile


def _timed(fn, n: int) -> float:
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - began) / n * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", required=True)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--steps", type=int, default=10, help="steps timed per stage")
    parser.add_argument("--out", type=Path, required=True, help="folder for the tables and the JSON")
    args = parser.parse_args()

    from omnivoice.bench.engine_load import EngineLoadConfig, make_requests
    from omnivoice.config import load_profile
    from omnivoice.engine.chunks import ThinkerChunk
    from omnivoice.engine.source import resolve_model_path
    from omnivoice.models.dummy import NEWLINE_ID
    from omnivoice.runners.factory import build_runners

    args.out.mkdir(parents=True, exist_ok=True)
    profile = load_profile(args.profile)
    source = resolve_model_path(profile)
    runners = build_runners(profile, source, only=(("thinker", 0), ("talker", 0), ("code2wav", 0)))
    thinker, talker, code2wav = (runners[(s, 0)] for s in ("thinker", "talker", "code2wav"))
    results: dict[str, dict] = {}
    for batch in args.batch:
        cfg = EngineLoadConfig(batch, batch, 0, prompt_tokens=128, text_tokens=64, audio_frames=240)
        requests = make_requests(profile, thinker.spec, cfg, NEWLINE_ID, batch, f"b{batch}")
        from omnivoice.engine.chunks import NewRequest

        for r in requests:
            thinker.accept(NewRequest(r))
        with torch.inference_mode():
            while len(thinker.running) < batch:  # prefill
                for out in thinker.step():
                    if isinstance(out, ThinkerChunk):
                        talker.accept(out)
            for _ in range(3):  # a few tokens ahead, so the talker has text to read
                for out in thinker.step():
                    if isinstance(out, ThinkerChunk):
                        talker.accept(out)
            for _ in range(2):
                talker.step()  # talker prefill and a first decode

            def thinker_step() -> None:
                for out in thinker.step():
                    if isinstance(out, ThinkerChunk):
                        talker.accept(out)

            figures = {
                "thinker_step_ms": _timed(thinker_step, args.steps),
                "talker_step_ms": _timed(talker.step, args.steps),
            }
            rows = thinker.decode_step.rows(batch)
            for name, step in (("thinker", thinker.decode_step), ("talker", talker.decode_step)):
                for key, entry in step.graphs.captured.items():
                    if key[0] == rows and key[1] == step.kv_sizes[0]:
                        figures[f"{name}_graph_replay_ms"] = _timed(entry.graph.replay, args.steps)
            entry = talker.predictor.run.captured.get(rows)
            if entry is not None:
                figures["code_predictor_graph_replay_ms"] = _timed(entry.graph.replay, args.steps)
            codes = torch.randint(0, 2048, (batch, 16, 50), device=code2wav.device)
            figures["code2wav_50_frames_ms"] = _timed(lambda c=codes: code2wav.model(c), 3)
            for name, fn in (
                ("thinker", thinker_step),
                ("talker", talker.step),
                ("code2wav", lambda c=codes: code2wav.model(c)),
            ):
                with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    for _ in range(3):
                        fn()
                    torch.cuda.synchronize()
                table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
                cpu = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
                (args.out / f"{name}-b{batch}.txt").write_text(table + "\n\n" + cpu)
        for r in requests:
            thinker.abort(r.request_id)
            talker.abort(r.request_id)
        results[f"batch {batch}"] = {k: round(v, 2) for k, v in figures.items()}
        print(f"batch {batch}: {json.dumps(results[f'batch {batch}'])}", flush=True)
    (args.out / "steps.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
