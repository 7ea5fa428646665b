"""Code2Wav's start at the full Qwen3-Omni size: how long its graphs take to warm up under each cuDNN
tuning setting, what each graph's replay then costs, and whether the audio changes.

    python benchmarks/code2wav_start.py --max-batch 64 --modes 1:10 1:3 16:10 65:0 --out /tmp/c2w.json

A mode is `tune_from_batch:benchmark_limit` (the code2wav stage's `cudnn_tune_from_batch` and
`cudnn_benchmark_limit`; a tune_from above max_batch tunes nothing: cuDNN's heuristics everywhere).
Each mode runs in a fresh process (cuDNN keeps its tuned choices per process), on the same seeded
random weights: Code2Wav alone (216M parameters) on cuda:0 in bf16, SnakeBeta fused, every (batch
bucket, window length) graph captured as the engine does at start. Writes per mode: the warm-up's
seconds, each graph's replay milliseconds (CUDA events), and the largest difference of its PCM from
the first mode's on the same codes (relative to the first mode's peak).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omnivoice.config import ChunkConfig
from omnivoice.models.dummy import DummySource, dummy_config
from omnivoice.runners.chunking import window_lengths
from omnivoice.runners.code2wav_step import Code2WavStep
from omnivoice.runners.vocoder_kernels import fuse_snakes

PCM_ROWS = (1, 8, 64)


def build(device: torch.device) -> Any:
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

    config: Any = dummy_config(DummySource("qwen3-omni-30b-a3b")).code2wav_config
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3OmniMoeCode2Wav(config).to(torch.bfloat16)
    return model.eval().requires_grad_(False)


def replay_ms(graph: torch.cuda.CUDAGraph, replays: int) -> float:
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / replays


def one_mode(mode: str, max_batch: int, pcm_path: Path, replays: int) -> dict[str, Any]:
    """Warm Code2Wav up under `mode` in this process; its figures (PCM written to `pcm_path`)."""
    tune_from, limit = (int(x) for x in mode.split(":"))
    device = torch.device("cuda:0")
    model = build(device)
    with torch.inference_mode():
        fuse_snakes(model)
        model(torch.zeros(1, int(model.config.num_quantizers), 8, dtype=torch.long, device=device))
    windows = window_lengths(ChunkConfig(first_frames=4, frames=25, left_context=25))
    step = Code2WavStep(
        model, windows, max_batch, device, True, tune_from_batch=tune_from, benchmark_limit=limit
    )
    torch.cuda.synchronize()
    began = time.perf_counter()
    step.warm_up()
    warm_s = time.perf_counter() - began
    replay = {
        f"{r}x{f}": round(replay_ms(e.graph, replays), 3)
        for (r, f), e in sorted(step.graphs.captured.items())
    }
    rng = np.random.default_rng(1)
    pcm: dict[str, np.ndarray] = {}
    with torch.inference_mode():
        for rows in (r for r in PCM_ROWS if r <= max_batch):
            for frames in windows:
                codes = [rng.integers(0, 2048, (step.groups, frames)) for _ in range(rows)]
                pcm[f"{rows}x{frames}"] = np.stack(step(codes))
    np.savez(pcm_path, **pcm)
    return {
        "mode": mode,
        "warm_up_s": round(warm_s, 2),
        "graphs": len(step.graphs.captured),
        "replay_ms": replay,
    }


def compare(first: Path, other: Path) -> dict[str, float]:
    a, b = np.load(first), np.load(other)
    return {k: float(np.abs(a[k] - b[k]).max() / max(np.abs(a[k]).max(), 1e-30)) for k in a.files}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--modes", nargs="+", default=["1:10", "1:3", "16:10", "65:0"])
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--one", help=argparse.SUPPRESS)  # run one mode in this process
    ap.add_argument("--pcm", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        args.out.write_text(json.dumps(one_mode(args.one, args.max_batch, args.pcm, args.replays)))
        return
    results: list[dict[str, Any]] = []
    folder = Path(tempfile.mkdtemp(prefix="c2w-start-"))
    for i, mode in enumerate(args.modes):
        out, pcm = folder / f"{i}.json", folder / f"{i}.npz"
        cmd = [sys.executable, __file__, "--one", mode, "--max-batch", str(args.max_batch)]
        cmd += ["--replays", str(args.replays), "--out", str(out), "--pcm", str(pcm)]
        subprocess.run(cmd, check=True)
        result = json.loads(out.read_text())
        result["pcm_rel_diff_vs_first"] = compare(folder / "0.npz", pcm)
        results.append(result)
        print(
            f"mode {mode}: warm-up {result['warm_up_s']} s, largest PCM difference "
            f"{max(result['pcm_rel_diff_vs_first'].values()):.2e}",
            flush=True,
        )
        meta = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "max_batch": args.max_batch}
        args.out.write_text(json.dumps({**meta, "modes": results}, indent=1))
    base = results[0]["replay_ms"]
    print("replay ms per graph (rows x window frames), and each mode's ratio to the first:")
    for r in results:
        ratio = [r["replay_ms"][k] / base[k] for k in base]
        print(f"  {r['mode']:>7}: sum {sum(r['replay_ms'].values()):8.2f} ms, worst ratio {max(ratio):.2f}")


if __name__ == "__main__":
    main()
