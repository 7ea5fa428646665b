"""The code predictor with its layers as Triton kernels against the same predictor's torch layers.

Run by tests/engine/test_predictor_kernels.py: in a subprocess under Triton's interpreter on the CPU
(small shapes), and in-process on CUDA at the full Qwen3-Omni size. Also `python -m` runnable:

    TRITON_INTERPRET=1 python -m tests.engine.predictor_kernels_check
"""

from __future__ import annotations

import argparse
import copy

import torch
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration as PredictorModule,
)

from omnivoice.models.dummy import DummySource, dummy_config
from omnivoice.runners.code_predictor import CodePredictor

# the full size's shape rules (head_dim a power of two >= 32, grouped kv heads), scaled down for the
# interpreter
SMALL = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 256}  # fmt: skip


def build(small: bool, device: str, seed: int = 0) -> PredictorModule:
    full = dummy_config(DummySource("qwen3-omni-30b-a3b"))
    config = copy.deepcopy(full.talker_config.code_predictor_config)
    if small:
        for key, value in SMALL.items():
            setattr(config, key, value)
    torch.manual_seed(seed)
    with torch.device(device):
        module = PredictorModule(config).to(torch.bfloat16)
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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--full", action="store_true", help="the full Qwen3-Omni size (CUDA)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=3)
    args = parser.parse_args()
    print(compare(not args.full, args.device, args.batch))


if __name__ == "__main__":
    main()
