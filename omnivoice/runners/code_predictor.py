"""The code predictor (MTP): codebooks 1..G-1 of a frame, G-1 sequential steps, batched over requests.

A whole frame (the two-position prefill, G-2 one-token steps, G-1 heads and samplings) is one
fixed-shape function of device tensors, so on a GPU it is captured as a single CUDA graph per batch
bucket (`StepGraphs`). Every row of a frame sits at the same positions, so row b simply uses KV
slot b of a scratch cache that lives for one frame.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from omnivoice.runners.decoder import DecoderStack
from omnivoice.runners.fused_layers import CompiledFn
from omnivoice.runners.graphs import StepGraphs

# transformers' generate() samples the residual codebooks with these when the talker samples
_TOP_K = 50
_TOP_P = 0.8


class CodePredictor:
    def __init__(
        self, module: Any, max_batch: int, device: torch.device, graphs: bool = False, compile: bool = False
    ) -> None:
        self.module = module
        self.stack = DecoderStack(module.model, multimodal_rope=False)
        if device.type == "cuda":
            self.stack.fuse(compile=compile)
        self.embeds = module.model.codec_embedding  # G-1 embeddings, one per residual codebook
        self.heads = module.lm_head  # G-1 heads
        self.groups = len(self.heads) + 1
        if any(head.bias is not None for head in self.heads):
            raise ValueError("code predictor heads with a bias are not supported")
        self.cache = self.stack.make_cache(max_batch, self.groups + 1, module.dtype, device)
        self.device = device
        self.run = StepGraphs(self._frame, "code predictor", enabled=graphs)
        self._code: Any = residual_code
        if device.type == "cuda" and compile:
            self._code = CompiledFn(residual_code, "code predictor sampling")

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
        b = hidden.shape[0]
        slots = torch.arange(b, device=hidden.device)
        start = torch.zeros(b, dtype=torch.long, device=hidden.device)
        kv_len = self.cache.max_len
        h, _ = self.stack.forward_indexed(
            torch.stack([hidden, code0], dim=1), self.cache, slots, start, kv_len
        )
        codes: list[torch.Tensor] = []
        embeds: list[torch.Tensor] = []
        for k in range(self.groups - 1):
            head, table = self.heads[k].weight, self.embeds[k].weight
            code, embed = self._code(h[:, -1], head, table, uniforms[:, k], greedy)
            codes.append(code)  # [B]
            embeds.append(embed)  # [B, Ht]
            if k == self.groups - 2:
                break
            h, _ = self.stack.forward_indexed(embeds[-1][:, None], self.cache, slots, start + 2 + k, kv_len)
        return torch.stack(codes, dim=1), torch.stack(embeds, dim=1)


def residual_code(
    hidden: torch.Tensor, head: torch.Tensor, table: torch.Tensor, u: torch.Tensor, greedy: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden [B, H] -> a residual code [B] (its head's logits sampled as `sample_residual`) and its
    embedding [B, H] from `table`."""
    code = sample_residual(F.linear(hidden, head), u, greedy)
    return code, F.embedding(code, table)


def sample_residual(logits: torch.Tensor, u: torch.Tensor, greedy: torch.Tensor) -> torch.Tensor:
    """One residual code per row: argmax where `greedy`, else transformers' top-k 50 then top-p 0.8 at
    temperature 1, drawn by inverse CDF with the row's uniform `u` [B]. Device ops only, on the 50
    best codes rather than the whole codebook (a handful of tiny kernels per code)."""
    scores = logits.float()
    top, index = torch.topk(scores, min(_TOP_K, scores.shape[-1]), dim=-1)  # descending
    top, index = top.flip(-1), index.flip(-1)  # ascending, as transformers' top-p sorts
    cum = top.softmax(-1).cumsum(-1)
    drop = cum <= (1 - _TOP_P)
    drop[:, -1] = False  # always keep the most likely code
    cdf = top.masked_fill(drop, float("-inf")).softmax(-1).cumsum(-1)  # [B, K]
    pick = torch.searchsorted(cdf, (u[:, None] * cdf[:, -1:]).contiguous(), right=True)
    drawn = index.gather(1, pick.clamp_max(cdf.shape[-1] - 1))[:, 0]
    return torch.where(greedy, logits.argmax(-1), drawn)
