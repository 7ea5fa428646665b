"""Where a decode step's time goes: per-stage step times, graph replay alone, and torch.profiler tables.

A development tool for the GPU runtime (not part of the package):

    python benchmarks/profile_steps.py --profile configs/h200-dummy.yaml --batch 1 32 --out /tmp/prof

Builds the thinker, talker and code2wav runners of the profile, starts `batch` requests, then times
steps of each stage alone (no other stage running), the bare CUDA-graph replays, and writes the
profiler's kernel and operator tables. Code2Wav is timed on random codes at its first-chunk and its
steady window (4 and 50 frames by default): transformers' forward at the exact shape, and the runner's
padded step eager and graphed (graphed only with `execution: cuda_graph`). `--code2wav-only` skips
the thinker and talker. A burst of `batch` new requests (`--prompt-tokens` each) is prefilled under
the profiler too (thinker-prefill-b<batch>.txt): the JSON sets its wall time beside its kernels' own
time, so a prefill bound by the host's launches shows as kernels far shorter than the wall.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity
from torch.profiler import profile as torch_profile


def _timed(fn, n: int, warmups: int = 0) -> float:
    for _ in range(warmups):
        fn()
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - began) / n * 1e3


def _write_profile(fn, path: Path) -> None:
    """torch.profiler's kernel table (by GPU time) and operator table (by CPU time) of three calls."""
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
    path.write_text(_tables(prof, 25))


def _tables(prof, rows: int) -> str:
    """The profiler's kernel table (by GPU time) and operator table (by CPU time), with names whole
    (inductor's fused kernels are named after the ops they fuse)."""
    events = prof.key_averages()
    width = {"row_limit": rows, "max_name_column_width": 160}
    return (
        events.table(sort_by="cuda_time_total", **width)
        + "\n\n"
        + events.table(sort_by="self_cpu_time_total", **width)
    )


@torch.inference_mode()
def code2wav_figures(code2wav, batch: int, steps: int, out: Path) -> dict[str, float]:
    """Code2Wav at `batch` windows of its first-chunk and steady lengths: transformers' forward at the
    exact shape, the runner's padded step eager and graphed, and the bare graph replay; at most as
    many windows as Code2Wav steps at once (its widest batch bucket)."""
    vocoder = code2wav.vocoder
    batch = min(batch, vocoder.batch_sizes[-1])
    figures: dict[str, float] = {}
    groups = vocoder.groups
    graphed = vocoder.graphs.pool is not None
    for frames in (code2wav.chunk.first_frames, code2wav.chunk.frames + code2wav.chunk.left_context):
        rng = np.random.default_rng(frames)
        windows = [rng.integers(0, 2048, (groups, frames), dtype=np.int64) for _ in range(batch)]
        codes = torch.from_numpy(np.stack(windows)).to(code2wav.device)  # [B, G, frames]
        figures[f"code2wav_{frames}f_forward_ms"] = _timed(lambda c=codes: code2wav.model(c), steps, 2)
        vocoder.graphs.enabled = False
        figures[f"code2wav_{frames}f_step_eager_ms"] = _timed(lambda w=windows: vocoder(w), steps, 2)
        if frames == code2wav.chunk.frames + code2wav.chunk.left_context:
            _write_profile(lambda w=windows: vocoder(w), out / f"code2wav-b{batch}.txt")
        vocoder.graphs.enabled = graphed
        if not graphed:
            continue
        figures[f"code2wav_{frames}f_step_graphed_ms"] = _timed(lambda w=windows: vocoder(w), steps, 2)
        entry = vocoder.graphs.captured[(vocoder.rows(batch), vocoder.frames(frames))]
        figures[f"code2wav_{frames}f_graph_replay_ms"] = _timed(entry.graph.replay, steps, 2)
        if frames == code2wav.chunk.frames + code2wav.chunk.left_context:
            _write_profile(entry.graph.replay, out / f"code2wav-graphed-b{batch}.txt")
    return figures


def _device_ms(prof) -> float:
    """The kernels' own time under `prof`, in ms (the GPU side of what was profiled)."""
    from torch.autograd import DeviceType

    # the kernels' own rows only: an operator's row repeats the time of the kernels it launched
    events = prof.key_averages()
    return sum(e.self_device_time_total for e in events if e.device_type == DeviceType.CUDA) / 1e3


def lm_figures(
    thinker, talker, profile, batch: int, steps: int, out: Path, prompt_tokens: int
) -> dict[str, float]:
    """Thinker and talker steps of `batch` running requests, and their bare graph replays."""
    from omnivoice.bench.engine_load import EngineLoadConfig, make_requests
    from omnivoice.messages import NewRequest, ThinkerChunk
    from omnivoice.models.dummy import NEWLINE_ID

    cfg = EngineLoadConfig(batch, batch, 0, prompt_tokens=prompt_tokens, text_tokens=64, audio_frames=240)

    def thinker_step() -> None:
        for out in thinker.step():
            if isinstance(out, ThinkerChunk):
                talker.accept(out)

    def prefill(tag: str) -> list:
        """A burst of `batch` new requests, prefilled together in one thinker step."""
        requests = make_requests(profile, thinker.spec, cfg, NEWLINE_ID, batch, f"{tag}{batch}")
        for r in requests:
            thinker.accept(NewRequest(r))
        while len(thinker.running) < batch:
            thinker_step()
        return requests

    def drop(requests: list) -> None:
        thinker_step()  # read back what is queued
        for r in requests:
            thinker.abort(r.request_id)
            talker.abort(r.request_id)

    figures: dict[str, float] = {}
    with torch.inference_mode():
        drop(prefill("warm"))  # first use of the prefill shapes
        torch.cuda.synchronize()
        began = time.perf_counter()
        timed = prefill("t")
        torch.cuda.synchronize()
        figures["thinker_prefill_ms"] = (time.perf_counter() - began) * 1e3
        drop(timed)
        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            began = time.perf_counter()
            requests = prefill("b")
            torch.cuda.synchronize()
        # the profiled prefill's wall time against its kernels' time: host-bound if far apart
        figures["thinker_prefill_profiled_ms"] = (time.perf_counter() - began) * 1e3
        figures["thinker_prefill_kernels_ms"] = _device_ms(prof)
        (out / f"thinker-prefill-b{batch}.txt").write_text(_tables(prof, 30))
        for _ in range(3):  # a few tokens ahead, so the talker has text to read
            thinker_step()
        torch.cuda.synchronize()
        began = time.perf_counter()
        talker.step()  # talker prefill (and its first tokens)
        torch.cuda.synchronize()
        figures["talker_prefill_ms"] = (time.perf_counter() - began) * 1e3
        talker.step()  # a first decode
        figures |= {
            "thinker_step_ms": _timed(thinker_step, steps),
            "talker_step_ms": _timed(talker.step, steps),
        }
        rows = thinker.decode_step.rows(batch)
        for name, step in (("thinker", thinker.decode_step), ("talker", talker.decode_step)):
            for key, entry in step.graphs.captured.items():
                if key[0] == rows and key[1] == step.kv_sizes[0]:
                    figures[f"{name}_graph_replay_ms"] = _timed(entry.graph.replay, steps)
        entry = talker.predictor.run.captured.get(rows)
        if entry is not None:
            figures["code_predictor_graph_replay_ms"] = _timed(entry.graph.replay, steps)
        _write_profile(thinker_step, out / f"thinker-b{batch}.txt")
        _write_profile(talker.step, out / f"talker-b{batch}.txt")
    for r in requests:
        thinker.abort(r.request_id)
        talker.abort(r.request_id)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", required=True)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--steps", type=int, default=10, help="steps timed per stage")
    parser.add_argument("--prompt-tokens", type=int, default=128, help="each request's prompt length")
    parser.add_argument("--code2wav-only", action="store_true", help="time Code2Wav alone")
    parser.add_argument("--out", type=Path, required=True, help="folder for the tables and the JSON")
    args = parser.parse_args()

    from omnivoice.config import load_profile
    from omnivoice.engine.loading import resolve_model_path
    from omnivoice.runners.factory import build_runners

    args.out.mkdir(parents=True, exist_ok=True)
    profile = load_profile(args.profile)
    widest = profile.stages.thinker.max_batch
    if not args.code2wav_only and max(args.batch) > widest:
        parser.error(f"--batch: at most the thinker's max_batch ({widest}) requests run at once")
    source = resolve_model_path(profile)
    stages = ("code2wav",) if args.code2wav_only else ("thinker", "talker", "code2wav")
    runners = build_runners(profile, source, only=tuple((s, 0) for s in stages))
    code2wav = runners[("code2wav", 0)]
    results: dict[str, dict] = {}
    for batch in args.batch:
        figures = {}
        if not args.code2wav_only:
            figures |= lm_figures(
                runners[("thinker", 0)],
                runners[("talker", 0)],
                profile,
                batch,
                args.steps,
                args.out,
                args.prompt_tokens,
            )
        figures |= code2wav_figures(code2wav, batch, args.steps, args.out)
        results[f"batch {batch}"] = {k: round(v, 2) for k, v in figures.items()}
        print(f"batch {batch}: {json.dumps(results[f'batch {batch}'])}", flush=True)
    (args.out / "steps.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
