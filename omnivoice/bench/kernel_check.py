"""The code predictor with its layers as Triton kernels against the same predictor's torch layers.

Run by tests/runners/test_predictor_kernels.py: in a subprocess under Triton's interpreter on the CPU
(small shapes), and in-process on CUDA at the full Qwen3-Omni size; benchmarks/predictor_frame.py
checks the kernels it times with it. Also `python -m` runnable:

    TRITON_INTERPRET=1 python -m omnivoice.bench.kernel_check
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
from typing import Any

import torch
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration as PredictorModule,
)

from omnivoice.models.dummy import DummySource, dummy_config
from omnivoice.runners.code_predictor import CodePredictor
from omnivoice.runners.predictor_kernels import LayerKernels, Tiles

# the full size's shape rules (head_dim a power of two >= 32, grouped kv heads), scaled down for the
# interpreter
SMALL = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 256}  # fmt: skip


def build(small: bool, device: str, seed: int = 0) -> PredictorModule:
    full: Any = dummy_config(DummySource("qwen3-omni-30b-a3b"))  # transformers types its sub-configs loosely
    config = copy.deepcopy(full.talker_config.code_predictor_config)
    if small:
        for key, value in SMALL.items():
            setattr(config, key, value)
    torch.manual_seed(seed)
    with torch.device(device):
        module = PredictorModule(config).to(torch.bfloat16)  # type: ignore[arg-type]
    return module.eval().requires_grad_(False)


def inputs(batch: int, hidden: int, device: str, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator(device="cpu").manual_seed(seed)
    groups = 16
    return {
        "talker_hidden": torch.randn(batch, hidden, generator=g).to(device, torch.bfloat16),
        "code0_embed": torch.randn(batch, hidden, generator=g).to(device, torch.bfloat16),
        "uniforms": torch.rand(batch, groups - 1, generator=g).to(device),
        "greedy": torch.ones(batch, dtype=torch.bool, device=device),
    }


def teacher_forced(kernels: CodePredictor, torch_layers: CodePredictor, x: dict[str, torch.Tensor]) -> dict:
    """A frame through both predictors' layers on the same inputs (each step's input the torch path's
    greedy code, so one near-tie flipped by rounding does not change every later input): the relative
    error of the final hidden state at each of the frame's steps, and how often the heads' argmax agree."""
    b = x["talker_hidden"].shape[0]
    device = kernels.device
    slots = torch.arange(b, device=device)
    start = torch.zeros(b, dtype=torch.long, device=device)
    run = kernels.kernels
    assert run is not None, "the predictor was built without kernels"
    stack, cache = torch_layers.stack, torch_layers.cache
    first = torch.stack([x["talker_hidden"], x["code0_embed"]], dim=1)
    want = stack.forward_indexed(first, cache, slots, start, cache.max_len)[0][:, -1]
    got = run.first(first)
    errors, agree = [], 0.0
    for k in range(kernels.groups - 1):
        errors.append(float((got.float() - want.float()).norm() / want.float().norm()))
        head = kernels.heads[k].weight
        code = torch.nn.functional.linear(want, head).argmax(-1)
        agree += float((torch.nn.functional.linear(got, head).argmax(-1) == code).float().mean())
        if k == kernels.groups - 2:
            break
        embed = kernels.embeds[k](code)
        want = stack.forward_indexed(embed[:, None], cache, slots, start + 2 + k, cache.max_len)[0][:, 0]
        got = run.step(embed, k)
    return {"step_rel_errors": errors, "argmax_agree": agree / (kernels.groups - 1)}


def compare(small: bool, device: str, batch: int) -> dict[str, object]:
    module = build(small, device)
    dev = torch.device(device)
    torch_layers = CodePredictor(module, batch, dev, kernels=False)
    kernels = CodePredictor(module, batch, dev, kernels=True)
    assert kernels.kernels is not None
    x = inputs(batch, module.config.hidden_size, device)
    with torch.inference_mode():
        forced = teacher_forced(kernels, torch_layers, x)
        want_codes, _ = torch_layers.predict(**x)
        codes, _ = kernels.predict(**x)
    return {
        **forced,
        "free_running_codes_equal": float((codes == want_codes).float().mean()),  # near-ties cascade
        "shape": "small" if small else "full",
    }


# one dense layer's four GEMMs (name: N, K, RMSNorm first, gated, residual), small and at full size
GEMMS = {
    "small": {"qkv": (64, 64, True, False, False), "o": (32, 128, False, False, True),
              "gate_up": (48, 64, True, True, False), "down": (32, 96, False, False, True)},
    "full": {"qkv": (4096, 1024, True, False, False), "o": (1024, 2048, False, False, True),
             "gate_up": (3072, 1024, True, True, False), "down": (1024, 3072, False, False, True)},
}  # fmt: skip


def _gemm_reference(x, weight, norm, gated, residual):  # type: ignore[no-untyped-def]
    """The GEMM kernel's formula in float32 torch ops."""
    h = x.float()
    if norm is not None:
        h = torch.nn.functional.rms_norm(h, (h.shape[-1],), norm.float(), 1e-6)
    y = h @ weight.float().T
    if gated:
        gate, up = y.chunk(2, dim=-1)
        y = torch.nn.functional.silu(gate) * up
    return y + residual.float() if residual is not None else y


def gemms(size: str, device: str, rows: tuple[int, ...], tiles: Tiles) -> dict[str, object]:
    """Each of a layer's GEMMs through the kernel with K split (as `tiles` split it) and unsplit,
    against float32 torch: the relative errors, each GEMM's split, whether the split's arrival counts
    are back at 0 after each GEMM, and whether a second run gives the same bits."""
    g = torch.Generator(device="cpu").manual_seed(3)
    dev = torch.device(device)
    positions = torch.zeros(1, 32, device=dev)
    split_run = LayerKernels(positions, positions, tiles)
    whole_run = LayerKernels(positions, positions, dataclasses.replace(tiles, max_split=1))
    errors: dict[str, float] = {}
    split_vs_whole: dict[str, float] = {}
    splits: dict[str, int] = {}
    clear = repeatable = True
    for name, (n, k, norm, gated, residual) in GEMMS[size].items():
        weight = (torch.randn((2 if gated else 1) * n, k, generator=g) / k**0.5).to(dev, torch.bfloat16)
        norm_w = (1 + 0.1 * torch.randn(k, generator=g)).to(dev, torch.bfloat16) if norm else None
        for m in rows:
            x = torch.randn(m, k, generator=g).to(dev, torch.bfloat16)
            res = torch.randn(m, n, generator=g).to(dev, torch.bfloat16) if residual else None
            kwargs = {"norm": (norm_w, 1e-6) if norm else None, "gated": gated, "residual": res}
            got = split_run._gemm(x, weight, **kwargs)  # type: ignore[arg-type]
            clear &= bool((split_run._sem == 0).all())
            repeatable &= torch.equal(split_run._gemm(x, weight, **kwargs), got)  # type: ignore[arg-type]
            whole = whole_run._gemm(x, weight, **kwargs)  # type: ignore[arg-type]
            want = _gemm_reference(x, weight, norm_w, gated, res)
            key = f"{name} m={m}"
            errors[key] = float((got.float() - want).norm() / want.norm())
            split_vs_whole[key] = float((got.float() - whole.float()).norm() / whole.float().norm())
            splits[key] = tiles.grid(m, n, k)[2]
    return {"gemm_rel_errors": errors, "split_vs_whole": split_vs_whole, "splits": splits,
            "counts_clear": clear, "repeatable": repeatable}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--full", action="store_true", help="the full Qwen3-Omni size (CUDA)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=3)
    parser.add_argument("--gemms", action="store_true", help="the layer's GEMMs alone, K split and not")
    parser.add_argument("--swap", action="store_true", help="the GEMMs' products transposed (Tiles.swap)")
    args = parser.parse_args()
    if args.gemms:
        tiles = Tiles(block_n=16, block_k=16, programs=64, max_split=4, swap=args.swap)  # splits small GEMMs
        print(gemms("small", args.device, (1, 5, 20), tiles))
    else:
        print(compare(not args.full, args.device, args.batch))


if __name__ == "__main__":
    main()
