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


def layer_errors(kernels: CodePredictor, torch_layers: CodePredictor, batch: int) -> list[float]:
    """Relative error of each layer's output, kernels vs torch, over a frame's prefill rows."""
    width = kernels.stack.layers[0].self_attn.q_proj.in_features
    device = kernels.device
    h = torch.randn(batch, 2, width, device=device, dtype=torch.bfloat16)
    slots = torch.arange(batch, device=device)
    start = torch.zeros(batch, dtype=torch.long, device=device)
    run = kernels.kernels
    keep = range(1, len(kernels.stack.layers) + 1)
    _, expected = torch_layers.stack.forward_indexed(h, torch_layers.cache, slots, start, 17, keep=keep)
    flat = h.reshape(2 * batch, width)
    errors = []
    for i, layer in enumerate(run.layers_w):
        rows = run.prefill_rows(batch)
        flat = run.run.layer(flat, layer, kernels.cache.k[i], kernels.cache.v[i], *rows)
        want = expected[i + 1].reshape(2 * batch, width).float()
        errors.append(float((flat.float() - want).norm() / want.norm()))
        flat = expected[i + 1].reshape(2 * batch, width).contiguous()  # each layer from the same input
    return errors


def compare(small: bool, device: str, batch: int) -> dict[str, object]:
    module = build(small, device)
    dev = torch.device(device)
    torch_layers = CodePredictor(module, batch, dev, kernels=False)
    kernels = CodePredictor(module, batch, dev, kernels=True)
    assert kernels.kernels is not None
    x = inputs(batch, module.config.hidden_size, device)
    with torch.inference_mode():
        errors = layer_errors(kernels, torch_layers, batch)
        want_codes, want_embeds = torch_layers.predict(**x)
        codes, embeds = kernels.predict(**x)
    return {
        "layer_rel_errors": errors,
        "codes_equal": float((codes == want_codes).float().mean()),
        "embeds_rel_error": float((embeds.float() - want_embeds.float()).norm() / want_embeds.float().norm()),
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
