"""A decoder layer's decode-step math as one plain function of tensors, compiled on GPUs.

Inside a CUDA graph a decode step costs what its kernels cost, and most of a layer's kernels are
small elementwise ones (norms, rope, residuals, the MoE's routing glue, activations), a few
microseconds each. `decode_layer` (norm, q/k/v GEMM, q/k norms, rope, the KV-cache writes,
attention, output projection, residual, norm, dense or MoE MLP, residual) is written as a pure
function of tensors, so torch.compile fuses it into a handful of kernels around the GEMMs, the cache
writes included (in place); every layer of a stack shares one compiled function (the weights are
arguments, not modules).

The math is transformers' Qwen3 / Qwen3-MoE layer (RMSNorms in float32, softmax routing with top-k
renormalisation, SiLU-gated experts, the talker's sigmoid-gated shared expert). Where a layer is not
of that shape, `layer_weights` returns None and the layer runs transformers' modules.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omnivoice.runners.device_errors import is_device_fault, is_out_of_memory
from omnivoice.runners.kv_cache import write_read

log = logging.getLogger(__name__)

# (token, expert) pairs above which a decode step's `moe` groups them by a sort rather than the one-hot
# scan: a decode step of 32 rows has 256 pairs in the thinker (prompts always sort: tens of thousands
# of pairs in a burst, and one compiled graph for every prompt batch)
SCAN_PAIRS = 2048


@dataclass(frozen=True)
class DenseWeights:
    gate_up: torch.Tensor  # [2I, H]: gate rows, then up rows
    down: torch.Tensor  # [H, I]


@dataclass(frozen=True)
class MoeWeights:
    router: torch.Tensor  # [E, H]
    gate_up: torch.Tensor  # [E, 2I, H]
    down: torch.Tensor  # [E, H, I]
    top_k: int
    renormalize: bool
    shared: DenseWeights | None  # the talker's shared expert
    shared_gate: torch.Tensor | None  # [1, H]


@dataclass(frozen=True)
class LayerWeights:
    in_norm: torch.Tensor
    qkv: torch.Tensor  # [(Hq + 2 Hkv) D, H]
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    o: torch.Tensor
    post_norm: torch.Tensor
    eps: float
    qk_eps: float
    q_heads: int
    kv_heads: int
    scaling: float
    mlp: DenseWeights | MoeWeights


def _is_silu(act: Any) -> bool:
    return isinstance(act, nn.SiLU) or type(act).__name__ == "SiLUActivation"


def layer_weights(layer: nn.Module, qkv: torch.Tensor, gate_up: torch.Tensor | None) -> LayerWeights | None:
    """The tensors of a Qwen3(-MoE) decoder layer (with its fused q/k/v and gate/up weights), or None
    if the layer is of another shape."""
    # transformers' submodules are duck-typed (their attributes differ by model and version): the
    # checks below decide whether this layer has the shape the fused math takes
    attn: Any = layer.self_attn
    mlp: Any = layer.mlp
    norm: Any = layer.input_layernorm
    post_norm: Any = layer.post_attention_layernorm
    mlp_weights: DenseWeights | MoeWeights
    if gate_up is not None and _is_silu(mlp.act_fn):
        mlp_weights = DenseWeights(gate_up, mlp.down_proj.weight)
    elif hasattr(mlp, "experts") and hasattr(mlp, "gate"):
        experts, router = mlp.experts, mlp.gate
        if getattr(experts, "is_transposed", False) or getattr(experts, "has_bias", False):
            return None
        if not _is_silu(experts.act_fn):
            return None
        shared = shared_gate = None
        if hasattr(mlp, "shared_expert"):
            se = mlp.shared_expert
            if not _is_silu(se.act_fn) or any(p.bias is not None for p in (se.gate_proj, se.up_proj)):
                return None
            shared = DenseWeights(torch.cat([se.gate_proj.weight, se.up_proj.weight]), se.down_proj.weight)
            shared_gate = mlp.shared_expert_gate.weight
        mlp_weights = MoeWeights(
            router.weight,
            experts.gate_up_proj,
            experts.down_proj,
            int(router.top_k),
            bool(router.norm_topk_prob),
            shared,
            shared_gate,
        )
    else:
        return None
    return LayerWeights(
        in_norm=norm.weight,
        qkv=qkv,
        q_norm=attn.q_norm.weight,
        k_norm=attn.k_norm.weight,
        o=attn.o_proj.weight,
        post_norm=post_norm.weight,
        eps=float(norm.variance_epsilon),
        qk_eps=float(attn.q_norm.variance_epsilon),
        q_heads=attn.q_proj.out_features // attn.head_dim,
        kv_heads=attn.k_proj.out_features // attn.head_dim,
        scaling=float(attn.scaling),
        mlp=mlp_weights,
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Qwen3 RMSNorm: statistics in float32, scaled by the weight in the input's dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def attention_inputs(
    h: torch.Tensor,
    w: LayerWeights,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """h [B, T, H], cos/sin [B, T, D] -> q [B, Hq, T, D], k and v [B, Hkv, T, D] (normed, rotated)."""
    b, t, _ = h.shape
    x = rms_norm(h, w.in_norm, w.eps)
    qkv = F.linear(x, w.qkv).view(b, t, w.q_heads + 2 * w.kv_heads, -1)
    q, k, v = qkv.split((w.q_heads, w.kv_heads, w.kv_heads), dim=2)
    q = rms_norm(q, w.q_norm, w.qk_eps)
    k = rms_norm(k, w.k_norm, w.qk_eps)
    c, s = cos.unsqueeze(2), sin.unsqueeze(2)  # [B, T, 1, D]
    q = q * c + _rotate_half(q) * s
    k = k * c + _rotate_half(k) * s
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def decode_layer(
    h: torch.Tensor,
    w: LayerWeights,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_idx: torch.Tensor,
    positions: torch.Tensor,
    mask: torch.Tensor,
    kv_len: int,
) -> torch.Tensor:
    """One layer of a decode step: h [B, T, H] at `positions` [B, T] of KV slots slot_idx [B] (this
    layer's k/v cache [slots, Hkv, max_len, D], written in place), attending to the first `kv_len`
    positions under `mask` [B, 1, T, kv_len] -> the layer's output [B, T, H]."""
    q, k, v = attention_inputs(h, w, cos, sin)
    keys, values = write_read(k_cache, v_cache, slot_idx, positions, k, v, kv_len)
    return attention_outputs(h, q, keys, values, mask, w)


def attention_outputs(
    h: torch.Tensor,
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    w: LayerWeights,
) -> torch.Tensor:
    """h [B, T, H] and the layer's attention inputs (keys/values [B, Hkv, K, D], mask [B, 1, T, K]
    True where attended) -> the layer's output [B, T, H]."""
    b, hq, t, d = q.shape
    group = hq // w.kv_heads
    qg = q.reshape(b, w.kv_heads, group * t, d)  # heads of a kv group share its keys: no repeat
    scores = torch.matmul(qg, keys.transpose(-1, -2)).float() * w.scaling  # [B, Hkv, G*T, K]
    scores = scores.view(b, w.kv_heads, group, t, -1).masked_fill(~mask.unsqueeze(2), float("-inf"))
    probs = scores.softmax(-1).to(q.dtype).view(b, w.kv_heads, group * t, -1)
    out = torch.matmul(probs, values).view(b, hq, t, d).transpose(1, 2).reshape(b, t, hq * d)
    h = h + F.linear(out, w.o)
    x = rms_norm(h, w.post_norm, w.eps)
    if isinstance(w.mlp, DenseWeights):
        return h + _dense(x, w.mlp)
    # prompts (t > 1) always group their pairs by a sort, so one compiled prefill graph serves every
    # prompt batch; a decode step (t == 1) scans unless it brings more than SCAN_PAIRS pairs
    return h + moe(x.view(b * t, -1), w.mlp, sort=t > 1).view(b, t, -1)


def _dense(x: torch.Tensor, w: DenseWeights) -> torch.Tensor:
    gate, up = F.linear(x, w.gate_up).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, w.down)


def moe(x: torch.Tensor, w: MoeWeights, sort: bool = False) -> torch.Tensor:
    """x [N, H] -> [N, H]: top-k of the softmax router, experts as two grouped GEMMs over the
    (token, expert) pairs grouped by expert, weighted and summed back per token (deterministic).
    `sort`: group by a sort whatever the number of pairs (the two groupings give the same result)."""
    n, hidden = x.shape
    experts = w.gate_up.shape[0]
    probs = F.linear(x, w.router).float().softmax(-1)
    top, chosen = torch.topk(probs, w.top_k, dim=-1)  # [N, k]
    if w.renormalize:
        top = top / top.sum(-1, keepdim=True)
    weights = top.to(x.dtype).reshape(-1)
    pairs = chosen.reshape(-1)  # [P], P = N*k, pair p = (token p // k, expert pairs[p])
    if sort or pairs.shape[0] > SCAN_PAIRS:
        # A prefill: group the pairs by a stable sort on their expert. The one-hot scan below does
        # [P, E] work, which dominates a layer once a burst of prompts brings thousands of pairs
        # (BENCHMARKS.md compares the two); both give the same groups in the same order.
        order, offsets = _sort_pairs(pairs, experts)
        out = _grouped_experts(x[order // w.top_k], w, offsets)
        per_pair = torch.empty_like(out)
        per_pair[order] = out  # back to pair order
    else:
        # Group the (token, expert) pairs by expert without a sort: a pair's place is its expert's
        # start plus how many earlier pairs chose that expert (elementwise work and one scan: fused
        # kernels)
        hits = (pairs.unsqueeze(1) == torch.arange(experts, device=x.device)).int()  # [P, E]
        seen = hits.cumsum(0)  # [P, E]: pairs up to p that chose each expert
        offsets = seen[-1].cumsum(0).to(torch.int32)  # [E]: end of each expert's group
        place = (offsets - seen[-1])[pairs] + seen.gather(1, pairs.unsqueeze(1)).squeeze(1) - 1  # [P]
        token = torch.arange(pairs.shape[0], device=x.device) // w.top_k
        grouped = x.new_empty(pairs.shape[0], hidden)
        grouped[place] = x[token]
        per_pair = _grouped_experts(grouped, w, offsets)[place]
    y = (per_pair * weights.unsqueeze(-1)).view(n, w.top_k, hidden).sum(1)
    if w.shared is not None:
        assert w.shared_gate is not None
        y = y + torch.sigmoid(F.linear(x, w.shared_gate)) * _dense(x, w.shared)
    return y


def _sort_pairs(pairs: torch.Tensor, experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The pairs grouped by expert: their order [P] (in token order within an expert) and the end of
    each expert's group [E], without a host sync."""
    order = torch.argsort(pairs, stable=True)
    counts = torch.zeros(experts, dtype=torch.int32, device=pairs.device)
    counts.scatter_add_(0, pairs, torch.ones_like(pairs, dtype=torch.int32))
    return order, counts.cumsum(0).to(torch.int32)


def _grouped_experts(grouped: torch.Tensor, w: MoeWeights, offsets: torch.Tensor) -> torch.Tensor:
    """The experts' SiLU-gated MLPs over pairs grouped by expert (groups ending at `offsets`)."""
    gate, up = torch._grouped_mm(grouped, w.gate_up.transpose(-2, -1), offs=offsets).chunk(2, dim=-1)
    return torch._grouped_mm(F.silu(gate) * up, w.down.transpose(-2, -1), offs=offsets)


def compile_fn(fn: Callable[..., Any]) -> Callable[..., Any]:
    """torch.compile for decode-step functions (dynamic shapes: one compilation serves every batch
    bucket, KV bucket and layer). Compilation happens at the first call, in the first warm-up step."""
    import torch._dynamo
    import torch.fx.experimental._config as fx_config

    # one code object serves the thinker, talker and code predictor stacks at several shapes
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    # sizes that happen to be equal (a KV bucket and a head dim, say) must not be assumed to stay so
    fx_config.use_duck_shape = False
    # a note inductor prints for every softmax it splits (the router's, the code predictor's heads)
    warnings.filterwarnings("ignore", message="\\s*Online softmax is disabled")
    return torch.compile(fn, dynamic=True, fullgraph=True)


class CompiledFn:
    """`fn` compiled by torch.compile; if compiling fails (no toolchain, an op the compiler cannot
    take), `fn` itself from then on, said once in the log. Same math either way. An error of the
    device (a failed allocation, a device fault: `device_errors`) is no compile failure: it is
    raised, and the next call runs compiled again."""

    def __init__(self, fn: Callable[..., Any], what: str) -> None:
        self.fn = fn
        self.what = what
        self.compiled = True
        self._compiled = compile_fn(fn)

    def __call__(self, *args: Any) -> Any:
        if self.compiled:
            try:
                return self._compiled(*args)
            except Exception as e:
                if is_out_of_memory(e) or is_device_fault(e):
                    raise  # the device's error, not the compiler's: the caller's to handle, compiled still
                log.warning("%s: not compiled (%s: %s); running eagerly", self.what, type(e).__name__, e)
                self.compiled = False
        return self.fn(*args)
