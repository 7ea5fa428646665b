"""The code predictor's frame at exact shapes, for the CPU, where nothing is captured as a graph.

A frame captured as a CUDA graph needs fixed shapes, so `code_predictor._TorchFrame` attends to the
whole scratch cache under a mask, reads it through index gathers and samples every row both ways
(top-k/top-p and argmax). On the CPU nothing needs fixed shapes, and a small model's frame costs
what its ops cost to dispatch whatever their size, so this frame does only what the frame's rows
need: attention to the positions filled so far (no mask; causal within the two-position pass, as
transformers' generate() runs it), the cache read and written through slices, the rotary angles of
a frame's positions computed once, and per code only the kind of pick its rows ask for. The layers
are the stack's transformers modules, as on `_TorchFrame`, and the angles are computed as generate()
computes them (one position set of a pass at a time), so a frame's hidden states are those of
transformers' forward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import apply_rotary_pos_emb

from omnivoice.runners.decoder import DecoderStack
from omnivoice.runners.kv_cache import SlotKVCache
from omnivoice.runners.residual_sampling import draw_residual, residual_code

CodeFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


class ExactFrame:
    """A frame's layer passes (`first`: the two positions, `step`: step k's one token at position
    2 + k), row b at KV slot b of the scratch cache; each returns the final-normed hidden state of
    the last position [B, Ht]."""

    def __init__(self, stack: DecoderStack, cache: SlotKVCache) -> None:
        if stack._fused:
            raise ValueError("the exact frame runs the stack's own modules, not fused layers")
        self.stack = stack
        self.cache = cache
        probe, device = cache.k.new_zeros(1), cache.k.device
        # each pass's start -> its positions' cos, sin [1, T, D], the same for every row
        self.rope = {0: stack.rotary(probe, torch.arange(2, device=device)[None])}
        for p in range(2, cache.max_len):
            self.rope[p] = stack.rotary(probe, torch.tensor([[p]], device=device))

    def first(self, x: torch.Tensor) -> torch.Tensor:
        return self._layers(x, 0)

    def step(self, embed: torch.Tensor, k: int) -> torch.Tensor:
        return self._layers(embed[:, None], 2 + k)

    def _layers(self, h: torch.Tensor, start: int) -> torch.Tensor:
        """h [B, T, Ht] at positions start..start+T of slots 0..B-1, after every earlier position."""
        b, t, _ = h.shape
        end = start + t
        cos, sin = self.rope[start]
        shape = (b, t, -1, self.stack.head_dim)
        for i, layer in enumerate(self.stack.layers):
            attn: Any = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_norm(attn.q_proj(x).view(shape)).transpose(1, 2)  # [B, Hq, T, D]
            k = attn.k_norm(attn.k_proj(x).view(shape)).transpose(1, 2)  # [B, Hkv, T, D]
            v = attn.v_proj(x).view(shape).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            self.cache.k[i, :b, :, start:end] = k
            self.cache.v[i, :b, :, start:end] = v
            keys, values = self.cache.k[i, :b, :, :end], self.cache.v[i, :b, :, :end]  # views
            out, _ = sdpa_attention_forward(attn, q, keys, values, None, dropout=0.0, scaling=attn.scaling)
            h = h + attn.o_proj(out.reshape(b, t, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.stack.norm(h)[:, -1]


def code_fn(greedy: torch.Tensor) -> CodeFn:
    """`residual_sampling.residual_code` for a frame whose rows are greedy where `greedy` [B] (a CPU
    tensor, read without a sync): the argmax alone when every row is greedy, the draw alone when
    none is, both only for a mix. Each gives the codes `residual_code` gives."""
    if bool(greedy.all()):
        return _argmax_code
    if not bool(greedy.any()):
        return _drawn_code
    return residual_code


def _argmax_code(
    hidden: torch.Tensor, head: torch.Tensor, table: torch.Tensor, u: torch.Tensor, greedy: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    code = F.linear(hidden, head).argmax(-1)
    return code, F.embedding(code, table)


def _drawn_code(
    hidden: torch.Tensor, head: torch.Tensor, table: torch.Tensor, u: torch.Tensor, greedy: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    code = draw_residual(F.linear(hidden, head), u)
    return code, F.embedding(code, table)
