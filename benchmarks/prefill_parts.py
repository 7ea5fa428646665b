"""Time the parts of a batched prefill, one decoder layer at a time, in their candidate forms.

A development tool for the GPU runtime (not part of the package):

    python benchmarks/prefill_parts.py --rows 1 32 --tokens 140 --out prefill.json

Builds one thinker decoder layer of the full-size architecture (random bf16 weights, ~1.2 GB) on the
device and times, for `rows` prompts of `tokens` tokens (right-padded, as the thinker prefills a
burst), each part of a layer's prefill in the forms the runtime could use:
- MoE: transformers' experts (`grouped_mm`, what the prefill runs by default), and `fused_layers.moe`
  run eagerly with each of its groupings (the one-hot scan of a decode step, the sort of a large
  prefill);
- attention: SDPA with the batch mask the prefill builds, and causal SDPA without a mask;
- KV-cache writes: one copy per row, and one indexed copy per tensor.
A change to the prefill should be measured here first, part by part: a part that gets slower can
hide in the whole prefill's time. `--reduced` runs the test-sized layer (CPU smoke test).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device, n: int, warmups: int = 2) -> float:
    """Mean milliseconds of `fn` over n calls, after warm-ups."""
    for _ in range(warmups):
        fn()
    _sync(device)
    began = time.perf_counter()
    for _ in range(n):
        fn()
    _sync(device)
    return (time.perf_counter() - began) / n * 1e3


def moe_grouped(by_sort: bool) -> Callable:
    """`fused_layers.moe` with its (token, expert) pairs grouped by a sort (what a prefill past
    SCAN_PAIRS takes) or by the one-hot scan (what a decode step takes), whatever their number."""
    from omnivoice.runners import fused_layers

    def run(x: torch.Tensor, w) -> torch.Tensor:
        saved = fused_layers.SCAN_PAIRS
        fused_layers.SCAN_PAIRS = -1 if by_sort else sys.maxsize
        try:
            return fused_layers.moe(x, w)
        finally:
            fused_layers.SCAN_PAIRS = saved

    return run


def part_figures(layer, weights, rows: int, tokens: int, steps: int, device, dtype, gen) -> dict[str, float]:
    """The parts of one layer's prefill of `rows` prompts of `tokens` tokens, in each candidate form."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    attn = layer.self_attn
    f: dict[str, float] = {}
    x = torch.randn(rows * tokens, attn.o_proj.out_features, device=device, dtype=dtype, generator=gen)
    ref = layer.mlp(x[None])[0]
    f["moe_transformers_ms"] = timed(lambda: layer.mlp(x[None]), device, steps)
    for name, fn in (("moe_one_hot", moe_grouped(by_sort=False)), ("moe_sorted", moe_grouped(by_sort=True))):
        f[f"{name}_max_abs_diff"] = float((fn(x, weights.mlp).float() - ref.float()).abs().max())
        f[f"{name}_ms"] = timed(lambda fn=fn: fn(x, weights.mlp), device, steps)
    d, hq, hkv = attn.head_dim, weights.q_heads, weights.kv_heads
    q = torch.randn(rows, hq, tokens, d, device=device, dtype=dtype, generator=gen)
    k = torch.randn(rows, hkv, tokens, d, device=device, dtype=dtype, generator=gen)
    v = torch.randn_like(k)
    pos = torch.arange(tokens, device=device)
    lengths = torch.full((rows,), tokens, device=device)
    lengths[rows // 2 :] = tokens * 3 // 4  # half the prompts shorter: right padding
    keys = pos.view(1, 1, 1, -1)
    mask = (keys <= pos.view(1, 1, -1, 1)) & (keys < lengths.view(-1, 1, 1, 1))
    f["attention_batch_mask_ms"] = timed(
        lambda: sdpa_attention_forward(attn, q, k, v, mask, dropout=0.0, scaling=attn.scaling), device, steps
    )
    f["attention_causal_ms"] = timed(
        lambda: sdpa_attention_forward(attn, q, k, v, None, dropout=0.0, scaling=attn.scaling), device, steps
    )
    cache = torch.zeros(rows + 1, hkv, tokens + 1, d, device=device, dtype=dtype)
    slot_idx = torch.arange(rows, device=device)
    positions = pos.expand(rows, -1)

    def per_row() -> None:
        for b in range(rows):
            cache[b, :, :tokens] = k[b]

    def indexed() -> None:
        cache[slot_idx.unsqueeze(1), :, positions] = k.transpose(1, 2)

    f["kv_write_per_row_ms"] = timed(per_row, device, steps)
    f["kv_write_indexed_ms"] = timed(indexed, device, steps)
    return f


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 32], help="prompts prefilled together")
    parser.add_argument("--tokens", type=int, default=140, help="tokens per prompt")
    parser.add_argument("--steps", type=int, default=10, help="timed calls per figure")
    parser.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--reduced", action="store_true", help="the test-sized layer (a CPU smoke test)")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args()

    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
        Qwen3OmniMoeThinkerTextDecoderLayer as Layer,
    )

    from omnivoice.models.dummy import REDUCED, DummySource, dummy_config
    from omnivoice.runners.fused_layers import layer_weights

    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    source = DummySource("qwen3-omni-30b-a3b", overrides=REDUCED if args.reduced else {})
    config = dummy_config(source).thinker_config.text_config
    config._experts_implementation = "grouped_mm"
    config._attn_implementation = "sdpa"
    print(f"building one thinker layer on {device} ({dtype})", file=sys.stderr, flush=True)
    with torch.device(device):
        layer = Layer(config, 0).to(dtype).eval().requires_grad_(False)
    gen = torch.Generator(device).manual_seed(0)
    for p in layer.parameters():
        p.normal_(0.0, p.shape[-1] ** -0.5 if p.dim() > 1 else 0.02, generator=gen)
    attn = layer.self_attn
    qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
    weights = layer_weights(layer, qkv, None)
    assert weights is not None, "the layer's shape is not one fused_layers handles"
    figures: dict[str, dict[str, float]] = {}
    with torch.inference_mode():
        for rows in args.rows:
            f = part_figures(layer, weights, rows, args.tokens, args.steps, device, dtype, gen)
            figures[f"rows {rows}"] = {key: round(val, 4) for key, val in f.items()}
            print(f"rows {rows} x {args.tokens} tokens: {json.dumps(figures[f'rows {rows}'])}", flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps({"device": str(device), "tokens": args.tokens, **figures}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
