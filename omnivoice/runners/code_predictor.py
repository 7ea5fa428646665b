"""The code predictor (MTP): codebooks 1..G-1 of a frame, G-1 sequential steps, batched over requests.

A whole frame (the two-position prefill, G-2 one-token steps, G-1 heads and samplings) is one
fixed-shape function of device tensors, so on a GPU it is captured as a single CUDA graph per batch
bucket (`StepGraphs`). Every row of a frame sits at the same positions, so row b simply uses KV
slot b of a scratch cache that lives for one frame.

On CUDA devices with Triton, the layers run as `predictor_kernels` (five kernels a layer instead of
~14 torch kernels), and each step's sampling and embedding gather as one `residual_code_kernel`
instead of ~17 torch kernels: at a few dozen rows a frame costs what its kernel launches and weight
reads cost, so fewer kernels make a faster frame (BENCHMARKS.md compares the two). Even so, the code
predictor is a large part of a talker step.

On the CPU nothing is captured, so a frame there runs at exact shapes instead (`predictor_exact`).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F

from omnivoice.runners.decoder import DecoderStack
from omnivoice.runners.fused_layers import CompiledFn
from omnivoice.runners.graphs import StepGraphs
from omnivoice.runners.predictor_exact import CodeFn, ExactFrame, code_fn
from omnivoice.runners.residual_sampling import residual_code

log = logging.getLogger(__name__)


class CodePredictor:
    def __init__(
        self,
        module: Any,
        max_batch: int,
        device: torch.device,
        graphs: bool = False,
        compile: bool = False,
        kernels: bool | None = None,
        exact: bool | None = None,
    ) -> None:
        """`kernels`: run the layers as `predictor_kernels` (null: on CUDA devices where Triton is
        installed and the layers are of a shape the kernels take; true: required, also on the CPU
        under Triton's interpreter, for tests; false: the torch layers). `exact`: frames at exact
        shapes (`predictor_exact`; null: on the CPU with the torch layers; false: the fixed-shape
        frame there too, as the benchmark compares)."""
        self.module = module
        self.stack = DecoderStack(module.model, multimodal_rope=False)
        if device.type == "cuda" or kernels:
            self.stack.fuse(compile=compile and device.type == "cuda")
        self.embeds = module.model.codec_embedding  # G-1 embeddings, one per residual codebook
        self.heads = module.lm_head  # G-1 heads
        self.groups = len(self.heads) + 1
        if any(head.bias is not None for head in self.heads):
            raise ValueError("code predictor heads with a bias are not supported")
        self.cache = self.stack.make_cache(max_batch, self.groups + 1, module.dtype, device)
        self.device = device
        self.kernels = self._layer_kernels(kernels, max_batch) if device.type == "cuda" or kernels else None
        if exact is None:
            exact = device.type == "cpu" and self.kernels is None
        if exact and (device.type != "cpu" or graphs or self.kernels is not None):
            raise ValueError("exact-shape frames run on the CPU with the torch layers, never captured")
        self.exact = ExactFrame(self.stack, self.cache) if exact else None
        self.run = StepGraphs(self._frame, "code predictor", enabled=graphs)
        self._code: Any = residual_code
        if self.kernels is not None:
            from omnivoice.runners import residual_code_kernel

            self._code = residual_code_kernel.residual_code  # sampling and gather: one Triton kernel
        elif device.type == "cuda" and compile:
            self._code = CompiledFn(residual_code, "code predictor sampling")

    def _layer_kernels(self, wanted: bool | None, max_batch: int) -> Any:
        if wanted is False:
            return None
        try:
            from omnivoice.runners import predictor_kernels, residual_code_kernel
        except ImportError as e:
            if wanted:
                raise
            log.info("code predictor: torch layers (no Triton: %s)", e)
            return None
        why = [predictor_kernels.KernelLayer.supported(w) for w in self.stack._fused] or ["not fused"]
        if any(why):
            if wanted:
                raise ValueError(f"code predictor kernels cannot run this model: {next(w for w in why if w)}")
            log.info("code predictor: torch layers (kernels: %s)", next(w for w in why if w))
            return None
        frame = _KernelFrame(self.stack, self.cache, max_batch, self.groups, predictor_kernels)
        try:  # compiles the kernels now: a GPU or Triton that cannot run them is found at start
            width = self.stack.layers[0].input_layernorm.weight.shape[0]
            h = frame.first(self.cache.k.new_zeros(1, 2, width))
            u, greedy = h.new_zeros(1, dtype=torch.float32), h.new_zeros(1, dtype=torch.bool)
            residual_code_kernel.residual_code(h, self.heads[0].weight, self.embeds[0].weight, u, greedy)
        except Exception as e:
            if wanted:
                raise
            log.warning("code predictor: torch layers (the kernels failed: %s: %s)", type(e).__name__, e)
            return None
        log.info("code predictor: Triton layer kernels")
        return frame

    def predict(
        self,
        talker_hidden: torch.Tensor,
        code0_embed: torch.Tensor,
        uniforms: torch.Tensor,
        greedy: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """talker_hidden, code0_embed: [B, Ht]; uniforms [B, G-1] (float32, one draw per sampled code);
        greedy [B] (bool: argmax instead). -> residual codes [B, G-1], their embeddings [B, G-1, Ht]."""
        b = talker_hidden.shape[0]
        inputs = {"hidden": talker_hidden, "code0": code0_embed, "uniforms": uniforms, "greedy": greedy}
        codes, embeds = self.run(b, inputs)
        return codes, embeds

    def _frame(
        self, hidden: torch.Tensor, code0: torch.Tensor, uniforms: torch.Tensor, greedy: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        layers: _TorchFrame | _KernelFrame | ExactFrame
        pick: CodeFn = self._code
        if self.exact is not None:
            layers, pick = self.exact, code_fn(greedy)
        else:
            layers = self.kernels or _TorchFrame(self.stack, self.cache, hidden.shape[0], hidden.device)
        h = layers.first(torch.stack([hidden, code0], dim=1))
        codes: list[torch.Tensor] = []
        embeds: list[torch.Tensor] = []
        for k in range(self.groups - 1):
            head, table = self.heads[k].weight, self.embeds[k].weight
            code, embed = pick(h, head, table, uniforms[:, k], greedy)
            codes.append(code)  # [B]
            embeds.append(embed)  # [B, Ht]
            if k == self.groups - 2:
                break
            h = layers.step(embed, k)
        return torch.stack(codes, dim=1), torch.stack(embeds, dim=1)


class _TorchFrame:
    """A frame's layer passes through the stack's torch layers: row b at KV slot b. `first` runs the
    frame's two positions, `step` the one-token step k at position 2 + k; each returns the final-normed
    hidden state of the last position [B, Ht]."""

    def __init__(self, stack: DecoderStack, cache: Any, b: int, device: torch.device) -> None:
        self.stack = stack
        self.cache = cache
        self.slots = torch.arange(b, device=device)
        self.start = torch.zeros(b, dtype=torch.long, device=device)

    def first(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.stack.forward_indexed(x, self.cache, self.slots, self.start, self.cache.max_len)
        return h[:, -1]

    def step(self, embed: torch.Tensor, k: int) -> torch.Tensor:
        start = self.start + 2 + k
        h, _ = self.stack.forward_indexed(embed[:, None], self.cache, self.slots, start, self.cache.max_len)
        return h[:, -1]


class _KernelFrame:
    """A frame's layer passes as Triton kernels over flat rows (`_TorchFrame`'s `first` and `step`; the
    two-position pass's row 2b + t is request b's position t), with the rope of the frame's positions
    and every row index tensor a frame uses made once (graph capture allows no host-to-device copies)."""

    def __init__(self, stack: DecoderStack, cache: Any, max_batch: int, groups: int, kernels: Any) -> None:
        self.cache = cache
        self.layers_w = [kernels.KernelLayer(w) for w in stack._fused]
        self.norm: Any = stack.norm  # a transformers RMSNorm: `weight`, `variance_epsilon`
        device = cache.k.device
        positions = torch.arange(cache.k.shape[3], device=device)[None]
        probe = torch.zeros(1, dtype=cache.k.dtype, device=device)
        cos, sin = stack.rotary(probe, positions)
        self.run = kernels.LayerKernels(cos[0], sin[0])
        rows = torch.arange(2 * max_batch, dtype=torch.int32, device=device)
        self._prefill = (rows // 2, rows % 2)  # row 2b + t: slot b, position t
        self._slots = rows[:max_batch]
        self._positions = (
            2
            + torch.arange(groups - 2, dtype=torch.int32, device=device)[:, None]
            .expand(-1, max_batch)
            .contiguous()
        )  # [G-2, max_batch]: step k's rows are all at position 2 + k

    def prefill_rows(self, b: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self._prefill[0][: 2 * b], self._prefill[1][: 2 * b], 2

    def step_rows(self, b: int, k: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self._slots[:b], self._positions[k, :b], 1

    def layers(
        self, h: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, per_slot: int
    ) -> torch.Tensor:
        for i, layer in enumerate(self.layers_w):
            h = self.run.layer(h, layer, self.cache.k[i], self.cache.v[i], slots, positions, per_slot)
        return h

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(h, (h.shape[-1],), self.norm.weight, self.norm.variance_epsilon)

    def first(self, x: torch.Tensor) -> torch.Tensor:
        b, t, width = x.shape
        h = self.layers(x.reshape(b * t, width), *self.prefill_rows(b))
        return self.final_norm(h.view(b, t, width)[:, -1])

    def step(self, embed: torch.Tensor, k: int) -> torch.Tensor:
        return self.final_norm(self.layers(embed.contiguous(), *self.step_rows(embed.shape[0], k)))
