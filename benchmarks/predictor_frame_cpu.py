"""One code-predictor frame on the CPU: the fixed-shape frame (as CUDA graphs capture it) vs the exact one.

    python benchmarks/predictor_frame_cpu.py --batch 1 4 --out /tmp/predictor-frame-cpu.json

Builds the tiny checkpoint's code predictor twice from the same weights, once with the fixed-shape
frame (`exact=False`) and once with the exact-shape frame the CPU default runs (`predictor_exact`),
and times frames of both in alternating rounds in one process, so a machine whose load drifts
slows both alike: the figure to read is each round's ratio exact / fixed, summarised by its median.
Checks that both give the same codes on every input. Prints a table and writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from omnivoice.models.tiny import build_tiny_model
from omnivoice.runners.code_predictor import CodePredictor

KINDS = ("greedy", "sampled", "mixed")


def frame_inputs(batch: int, hidden: int, groups: int, kind: str, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    greedy = {
        "greedy": torch.ones(batch, dtype=torch.bool),
        "sampled": torch.zeros(batch, dtype=torch.bool),
        "mixed": torch.arange(batch) % 2 == 0,
    }[kind]
    return {
        "talker_hidden": torch.randn(batch, hidden, generator=g),
        "code0_embed": torch.randn(batch, hidden, generator=g),
        "uniforms": torch.rand(batch, groups - 1, generator=g),
        "greedy": greedy,
    }


def frame_ms(predictor: CodePredictor, x: dict[str, torch.Tensor], frames: int) -> float:
    """Milliseconds a frame, over `frames` frames."""
    began = time.perf_counter()
    for _ in range(frames):
        predictor.predict(**x)
    return (time.perf_counter() - began) * 1e3 / frames


def compare(fixed: CodePredictor, exact: CodePredictor, x: dict[str, torch.Tensor], args) -> dict:
    """Alternating rounds of `args.frames` frames each, the order swapped every round."""
    fixed_codes, _ = fixed.predict(**x)
    exact_codes, _ = exact.predict(**x)
    times: dict[str, list[float]] = {"fixed": [], "exact": []}
    ratios = []
    for r in range(args.rounds):
        order = (("fixed", fixed), ("exact", exact)) if r % 2 == 0 else (("exact", exact), ("fixed", fixed))
        row = {name: frame_ms(p, x, args.frames) for name, p in order}
        for name, ms in row.items():
            times[name].append(ms)
        ratios.append(row["exact"] / row["fixed"])
    return {
        "fixed_ms_median": round(statistics.median(times["fixed"]), 3),
        "exact_ms_median": round(statistics.median(times["exact"]), 3),
        "ratio_median": round(statistics.median(ratios), 3),
        "ratio_min": round(min(ratios), 3),
        "ratio_max": round(max(ratios), 3),
        "same_codes": torch.equal(fixed_codes, exact_codes),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS), help="rows' sampling")
    parser.add_argument("--rounds", type=int, default=20, help="alternating rounds per batch and kind")
    parser.add_argument("--frames", type=int, default=20, help="frames timed per round and frame")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (the stages' default)")
    parser.add_argument("--out", type=Path, required=True, help="JSON file for the figures")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, _ = build_tiny_model(seed=0)
    module = model.talker.code_predictor.eval().requires_grad_(False)
    top, cpu = max(args.batch), torch.device("cpu")
    fixed = CodePredictor(module, top, cpu, exact=False)
    exact = CodePredictor(module, top, cpu)
    assert exact.exact is not None and fixed.exact is None
    hidden = module.config.hidden_size
    figures: dict[str, object] = {"threads": args.threads, "rounds": args.rounds, "frames": args.frames}
    print("frame ms (median of rounds), exact / fixed (median, min-max of rounds)", flush=True)
    with torch.inference_mode():
        for batch in args.batch:
            for kind in [k for k in args.kinds if batch > 1 or k != "mixed"]:  # one row is never mixed
                x = frame_inputs(batch, hidden, fixed.groups, kind, seed=batch)
                figures[f"batch {batch} {kind}"] = row = compare(fixed, exact, x, args)
                print(
                    f"batch {batch} {kind:>7}: fixed {row['fixed_ms_median']:.3f}  exact "
                    f"{row['exact_ms_median']:.3f}  ratio {row['ratio_median']:.3f} "
                    f"({row['ratio_min']:.3f}-{row['ratio_max']:.3f})  same codes {row['same_codes']}",
                    flush=True,
                )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
