"""One code-predictor frame at the full Qwen3-Omni size: torch layers (compiled) vs Triton layer kernels.

    python benchmarks/predictor_frame.py --batch 1 8 32 --out /tmp/predictor-frame.json

Builds only the code predictor (random bf16 weights, the dummy architecture's config) on cuda:0, then
for each batch captures one frame as a CUDA graph with each kind of layers and times the bare graph
replays (CUDA events). Also checks the kernels against the torch layers (relative error per layer,
greedy codes equal). Prints a table and writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch

from omnivoice.bench.kernel_check import GEMMS, build, compare, inputs
from omnivoice.runners.code_predictor import CodePredictor
from omnivoice.runners.predictor_kernels import LayerKernels, Tiles
from omnivoice.runners.residual_sampling import residual_code


def replay_ms(predictor: CodePredictor, batch: int, hidden: int, replays: int) -> float:
    with torch.inference_mode():
        predictor.predict(**inputs(batch, hidden, "cuda"))  # capture
    return graph_ms(predictor.run.captured[batch].graph, replays)


def graph_ms(graph: torch.cuda.CUDAGraph, replays: int) -> float:
    """Milliseconds a replay of `graph`, over `replays` replays after a few untimed ones (CUDA events)."""
    for _ in range(5):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / replays


def tiles_of(spec: str) -> Tiles:
    """BLOCK_N x BLOCK_K x stages x warps [x programs][s], e.g. 32x128x4x4, 32x128x4x4x0 (K never split),
    64x128x4x4x128s (the products transposed: `Tiles.swap`)."""
    values = [int(v) for v in spec.removesuffix("s").split("x")]
    return Tiles(*values, swap=spec.endswith("s"))


def gemm_us(run: LayerKernels, batch: int, replays: int) -> dict[str, float]:
    """Each of a full-size layer's four GEMMs alone: microseconds a call, from a CUDA graph of 20 calls."""
    g = torch.Generator(device="cpu").manual_seed(0)
    times = {}
    for name, (n, k, norm, gated, residual) in GEMMS["full"].items():
        weight = torch.randn((2 if gated else 1) * n, k, generator=g).to("cuda", torch.bfloat16)
        x = torch.randn(batch, k, generator=g).to("cuda", torch.bfloat16)
        kwargs = {
            "norm": (torch.ones(k, device="cuda", dtype=torch.bfloat16), 1e-6) if norm else None,
            "gated": gated,
            "residual": torch.zeros(batch, n, device="cuda", dtype=torch.bfloat16) if residual else None,
        }
        run._gemm(x, weight, **kwargs)  # compiles
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(20):
                run._gemm(x, weight, **kwargs)
        split = run.tiles.grid(batch, n, k)[2]
        times[f"{name} {n}x{k} split {split}"] = round(graph_ms(graph, replays) * 1000 / 20, 2)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument(
        "--tiles",
        nargs="+",
        default=["16x128x4x4"],
        help="GEMM tilings of the kernels to time, each BLOCK_N x BLOCK_K x stages x warps, then "
        "optionally the programs a GEMM should have (K split to get there; 0: never split), then "
        "optionally s (the products transposed)",
    )
    parser.add_argument(
        "--torch-sampling",
        action="store_true",
        help="also time the first tiling with each step's sampling and embedding as torch ops",
    )
    parser.add_argument(
        "--gemms", action="store_true", help="also time each of a layer's GEMMs alone, per tiling and batch"
    )
    parser.add_argument(
        "--profile-out", type=Path, help="folder for each kind's kernel table at the top batch"
    )
    parser.add_argument("--replays", type=int, default=50, help="graph replays timed per batch and kind")
    parser.add_argument("--out", type=Path, required=True, help="JSON file for the figures")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    began = time.perf_counter()
    module = build(small=False, device="cuda")
    hidden = module.config.hidden_size
    device = torch.device("cuda")
    top = max(args.batch)
    kinds = {"torch_compiled": CodePredictor(module, top, device, graphs=True, compile=True, kernels=False)}
    for spec in args.tiles:
        kinds[f"triton_{spec}"] = predictor = CodePredictor(module, top, device, graphs=True, kernels=True)
        predictor.kernels.run.tiles = tiles_of(spec)
    if args.torch_sampling:  # the first tiling's layers with the torch ops' sampling and gather
        name = f"triton_{args.tiles[0]}_torch_sampling"
        kinds[name] = predictor = CodePredictor(module, top, device, graphs=True, kernels=True)
        predictor.kernels.run.tiles = tiles_of(args.tiles[0])
        predictor._code = residual_code
    figures: dict[str, object] = {"machine": torch.cuda.get_device_name(), "replays": args.replays}
    print("frame ms (graph replay):", "  ".join(kinds), flush=True)
    for batch in args.batch:
        row = {name: replay_ms(p, batch, hidden, args.replays) for name, p in kinds.items()}
        figures[f"batch {batch}"] = row
        print(f"batch {batch:>3}:", "  ".join(f"{name} {ms:.3f}" for name, ms in row.items()), flush=True)
    if args.gemms:
        figures["gemm_us"] = gemm_table = {}
        for spec in args.tiles:
            run = kinds[f"triton_{spec}"].kernels.run
            for batch in args.batch:
                gemm_table[f"{spec} batch {batch}"] = row = gemm_us(run, batch, args.replays)
                print(f"GEMMs us, {spec}, batch {batch}:", row, flush=True)
    if args.profile_out is not None:
        from torch.profiler import ProfilerActivity, profile

        for name, predictor in kinds.items():
            graph = predictor.run.captured[top].graph
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    graph.replay()
                torch.cuda.synchronize()
            table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=30)
            args.profile_out.mkdir(parents=True, exist_ok=True)
            (args.profile_out / f"{name}-b{top}.txt").write_text(table)
    figures["accuracy_batch_32"] = compare(small=False, device="cuda", batch=32)
    print("accuracy:", figures["accuracy_batch_32"])
    figures["took_s"] = round(time.perf_counter() - began, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=1))
    print(f"wrote {args.out} ({figures['took_s']} s)")


if __name__ == "__main__":
    main()
