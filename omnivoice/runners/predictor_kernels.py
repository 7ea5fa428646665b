"""The code predictor's decoder layers as five Triton kernels each (CUDA; Triton's interpreter in tests).

A frame of the code predictor is 15 sequential passes through its 5 small dense layers, 75 layer
passes for a batch of at most a few dozen rows. Each pass reads ~30 MB of weights (a few microseconds
of memory time), but as torch ops, even compiled and replayed from a CUDA graph, it is ~14 kernels:
norms, rope, KV writes and residuals each their own launch between the GEMMs. Here a layer is five
kernels, each a GEMM with the glue of its neighbours fused into its prologue or epilogue:

1. `_qkv_kernel`: input RMSNorm, q/k/v projection, per-head q/k RMSNorm and rope; q to a buffer,
   k and v straight into the KV cache at each row's (slot, position);
2. `_attention_kernel`: one row and KV head per program, causal to the row's position;
3. `_linear_residual_kernel`: output projection plus the residual;
4. `_gate_up_kernel`: post-attention RMSNorm, gate and up projections, SiLU(gate) * up;
5. `_linear_residual_kernel`: down projection plus the residual.

Rows are flat: row m is one token of one request, at KV slot `slots[m]` and position `positions[m]`,
so the frame's two-position prefill and its one-token steps are the same kernels. The math is
`fused_layers.decode_layer`'s, rounding to the model's dtype where it rounds (GEMM outputs, norms),
with fp32 accumulation; rope is computed in fp32 and rounded once, so results match the torch layer
to the dtype's rounding, not bit for bit (the graphed and eager runs of the engine both use these
kernels, so they agree exactly with each other).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from omnivoice.runners.fused_layers import DenseWeights, LayerWeights

# Triton's interpreter (TRITON_INTERPRET=1, the CPU tests) has no bfloat16 matrix product: upcast first
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _dot(a, b, acc, F32: tl.constexpr):
    if F32:
        return acc + tl.dot(a.to(tl.float32), b.to(tl.float32))
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _rstd(x_ptr, rows, row_ok, K: tl.constexpr, eps, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """1 / RMS of rows `rows` of x [M, K] (float32 statistics)."""
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        ok = row_ok[:, None] & (cols[None, :] < K)
        x = tl.load(x_ptr + rows[:, None] * K + cols[None, :], mask=ok, other=0.0).to(tl.float32)
        ss += tl.sum(x * x, axis=1)
    return tl.rsqrt(ss / K + eps)


@triton.jit
def _normed(x_ptr, w_ptr, rows, row_ok, cols, K: tl.constexpr, rstd):
    """Columns `cols` of RMSNorm(x) as transformers' Qwen3 RMSNorm rounds it: (x * rstd) in the
    model's dtype, times the weight in the model's dtype."""
    dt = x_ptr.dtype.element_ty
    ok = row_ok[:, None] & (cols[None, :] < K)
    x = tl.load(x_ptr + rows[:, None] * K + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
    xn = (x * rstd[:, None]).to(dt).to(tl.float32)
    return (xn * w[None, :]).to(dt)


@triton.jit
def _weight_tile(w_ptr, out_rows, cols, K: tl.constexpr):
    """W[out_rows, cols] of a row-major [N, K] weight, as a [len(cols), len(out_rows)] tile (W^T)."""
    return tl.load(w_ptr + out_rows[None, :] * K + cols[:, None], mask=cols[:, None] < K, other=0.0)


@triton.jit
def _qkv_kernel(
    h_ptr, in_norm_ptr, w_ptr, q_norm_ptr, k_norm_ptr, cos_ptr, sin_ptr, slot_ptr, pos_ptr,
    q_ptr, k_cache_ptr, v_cache_ptr,
    M, eps, qk_eps, cache_slot, cache_head, cache_pos,
    H: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, F32: tl.constexpr,
):  # fmt: skip
    head = tl.program_id(0)  # 0..HQ-1: q heads, then HKV k heads, then HKV v heads
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    dt = h_ptr.dtype.element_ty
    HALF: tl.constexpr = D // 2
    lo = tl.arange(0, HALF)
    rstd = _rstd(h_ptr, rows, row_ok, H, eps, BLOCK_M, BLOCK_K)
    acc_lo = tl.zeros([BLOCK_M, HALF], dtype=tl.float32)  # the head's first and second halves: rope
    acc_hi = tl.zeros([BLOCK_M, HALF], dtype=tl.float32)  # pairs them
    for k0 in range(0, H, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        x = _normed(h_ptr, in_norm_ptr, rows, row_ok, cols, H, rstd)
        acc_lo = _dot(x, _weight_tile(w_ptr, head * D + lo, cols, H), acc_lo, F32)
        acc_hi = _dot(x, _weight_tile(w_ptr, head * D + HALF + lo, cols, H), acc_hi, F32)
    y_lo = acc_lo.to(dt).to(tl.float32)
    y_hi = acc_hi.to(dt).to(tl.float32)
    slot = tl.load(slot_ptr + rows, mask=row_ok, other=0)
    pos = tl.load(pos_ptr + rows, mask=row_ok, other=0)
    if head < HQ + HKV:  # q or k: per-head RMSNorm, then rope at the row's position
        is_q = head < HQ
        n_lo = tl.where(is_q, tl.load(q_norm_ptr + lo), tl.load(k_norm_ptr + lo)).to(tl.float32)
        n_hi = tl.where(is_q, tl.load(q_norm_ptr + HALF + lo), tl.load(k_norm_ptr + HALF + lo)).to(tl.float32)
        r = tl.rsqrt((tl.sum(y_lo * y_lo, axis=1) + tl.sum(y_hi * y_hi, axis=1)) / D + qk_eps)
        y_lo = ((y_lo * r[:, None]).to(dt).to(tl.float32) * n_lo[None, :]).to(dt).to(tl.float32)
        y_hi = ((y_hi * r[:, None]).to(dt).to(tl.float32) * n_hi[None, :]).to(dt).to(tl.float32)
        at = pos[:, None] * D + lo[None, :]
        c_lo = tl.load(cos_ptr + at).to(tl.float32)
        c_hi = tl.load(cos_ptr + at + HALF).to(tl.float32)
        s_lo = tl.load(sin_ptr + at).to(tl.float32)
        s_hi = tl.load(sin_ptr + at + HALF).to(tl.float32)
        out_lo = y_lo * c_lo - y_hi * s_lo  # x * cos + rotate_half(x) * sin
        out_hi = y_hi * c_hi + y_lo * s_hi
    else:
        out_lo = y_lo
        out_hi = y_hi
    ok = row_ok[:, None]
    if head < HQ:
        dst = q_ptr + rows[:, None] * (HQ * D) + head * D + lo[None, :]
    elif head < HQ + HKV:
        dst = k_cache_ptr + slot[:, None] * cache_slot + (head - HQ) * cache_head + pos[:, None] * cache_pos
        dst += lo[None, :]
    else:
        dst = v_cache_ptr + slot[:, None] * cache_slot + (head - HQ - HKV) * cache_head
        dst += pos[:, None] * cache_pos + lo[None, :]
    tl.store(dst, out_lo.to(dt), mask=ok)
    tl.store(dst + HALF, out_hi.to(dt), mask=ok)


@triton.jit
def _attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, pos_ptr, out_ptr, scaling, cache_slot, cache_head, cache_pos,
    HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BLOCK_KV: tl.constexpr,
):  # fmt: skip
    m = tl.program_id(0)
    kv_head = tl.program_id(1)
    dt = q_ptr.dtype.element_ty
    GROUP: tl.constexpr = HQ // HKV  # q heads sharing this kv head
    slot = tl.load(slot_ptr + m)
    pos = tl.load(pos_ptr + m)
    heads = kv_head * GROUP + tl.arange(0, GROUP)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + m * (HQ * D) + heads[:, None] * D + d[None, :]).to(tl.float32)  # [G, D]
    j = tl.arange(0, BLOCK_KV)
    seen = j <= pos  # causal: keys up to the row's own position
    at = slot * cache_slot + kv_head * cache_head + j[:, None] * cache_pos + d[None, :]
    k = tl.load(k_cache_ptr + at, mask=seen[:, None], other=0.0).to(tl.float32)  # [KV, D]
    scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2).to(dt).to(tl.float32) * scaling  # [G, KV]
    scores = tl.where(seen[None, :], scores, float("-inf"))
    p = tl.exp(scores - tl.max(scores, axis=1)[:, None])
    p = (p / tl.sum(p, axis=1)[:, None]).to(dt).to(tl.float32)
    v = tl.load(v_cache_ptr + at, mask=seen[:, None], other=0.0).to(tl.float32)
    out = tl.sum(p[:, :, None] * v[None, :, :], axis=1)  # [G, D]
    tl.store(out_ptr + m * (HQ * D) + heads[:, None] * D + d[None, :], out.to(dt))


@triton.jit
def _linear_residual_kernel(
    x_ptr, w_ptr, res_ptr, out_ptr, M, N: tl.constexpr, K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, F32: tl.constexpr,
):  # fmt: skip
    """out = res + x @ W^T (the product rounded to the dtype first, as torch's h + F.linear(x, W))."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    dt = x_ptr.dtype.element_ty
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        ok = row_ok[:, None] & (cols[None, :] < K)
        x = tl.load(x_ptr + rows[:, None] * K + cols[None, :], mask=ok, other=0.0)
        w_ok = (cols[:, None] < K) & (n[None, :] < N)
        w = tl.load(w_ptr + n[None, :] * K + cols[:, None], mask=w_ok, other=0.0)
        acc = _dot(x, w, acc, F32)
    ok = row_ok[:, None] & (n[None, :] < N)
    at = rows[:, None] * N + n[None, :]
    res = tl.load(res_ptr + at, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + at, (res + acc.to(dt).to(tl.float32)).to(dt), mask=ok)


@triton.jit
def _gate_up_kernel(
    h_ptr, norm_ptr, w_ptr, out_ptr, M, eps, H: tl.constexpr, INTER: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, F32: tl.constexpr,
):  # fmt: skip
    """out = SiLU(x @ Wg^T) * (x @ Wu^T), x = RMSNorm(h); W = [Wg; Wu] is [2 INTER, H]."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    dt = h_ptr.dtype.element_ty
    rstd = _rstd(h_ptr, rows, row_ok, H, eps, BLOCK_M, BLOCK_K)
    gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    n_ok = n[None, :] < INTER
    for k0 in range(0, H, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        x = _normed(h_ptr, norm_ptr, rows, row_ok, cols, H, rstd)
        ok = (cols[:, None] < H) & n_ok
        wg = tl.load(w_ptr + n[None, :] * H + cols[:, None], mask=ok, other=0.0)
        wu = tl.load(w_ptr + (INTER + n[None, :]) * H + cols[:, None], mask=ok, other=0.0)
        gate = _dot(x, wg, gate, F32)
        up = _dot(x, wu, up, F32)
    g = gate.to(dt).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32) * up.to(dt).to(tl.float32)
    tl.store(out_ptr + rows[:, None] * INTER + n[None, :], act.to(dt), mask=row_ok[:, None] & n_ok)


def _block_m(m: int) -> int:
    return min(64, max(16, triton.next_power_of_2(m)))


@dataclass(frozen=True)
class KernelLayer:
    """One dense layer's weights for the kernels (`fused_layers.LayerWeights` of a dense layer)."""

    w: LayerWeights
    mlp: DenseWeights
    head_dim: int

    @staticmethod
    def supported(w: LayerWeights | None) -> str | None:
        """Why the kernels cannot run layer `w`, or None if they can."""
        if w is None:
            return "not a Qwen3 layer"
        if not isinstance(w.mlp, DenseWeights):
            return "an MoE layer"
        if w.qkv.dtype not in (torch.bfloat16, torch.float16):
            return f"dtype {w.qkv.dtype} (bfloat16 and float16 only)"
        d = w.q_norm.shape[0]
        group = w.q_heads // w.kv_heads
        if d < 32 or d & (d - 1) or group & (group - 1) or w.q_heads % w.kv_heads:
            return f"head_dim {d} / {w.q_heads} q heads per {w.kv_heads} kv heads"
        return None


class LayerKernels:
    """Runs dense decoder layers over flat rows with the five kernels (see the module docstring)."""

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor) -> None:
        """cos, sin: [positions, head_dim], the rope of every position a row may be at."""
        self.cos = cos.contiguous()
        self.sin = sin.contiguous()
        self.f32 = _INTERPRET

    def layer(
        self,
        h: torch.Tensor,
        layer: KernelLayer,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slots: torch.Tensor,
        positions: torch.Tensor,
    ) -> torch.Tensor:
        """h [M, H] (contiguous), row m at KV slot slots[m] and position positions[m] (int32 [M]) of
        this layer's k/v cache [slots, Hkv, max_len, D] (written in place) -> the layer's output [M, H]."""
        w, mlp, d = layer.w, layer.mlp, layer.head_dim
        m, hidden = h.shape
        hq, hkv = w.q_heads, w.kv_heads
        bm = _block_m(m)
        rows = triton.cdiv(m, bm)
        strides = (k_cache.stride(0), k_cache.stride(1), k_cache.stride(2))
        q = h.new_empty(m, hq * d)
        _qkv_kernel[(hq + 2 * hkv, rows)](
            h, w.in_norm, w.qkv, w.q_norm, w.k_norm, self.cos, self.sin, slots, positions,
            q, k_cache, v_cache, m, w.eps, w.qk_eps, *strides,
            H=hidden, HQ=hq, HKV=hkv, D=d, BLOCK_M=bm, BLOCK_K=64, F32=self.f32, num_warps=4, num_stages=3,
        )  # fmt: skip
        attn = torch.empty_like(q)
        block_kv = triton.next_power_of_2(k_cache.shape[2])
        _attention_kernel[(m, hkv)](
            q, k_cache, v_cache, slots, positions, attn, w.scaling, *strides,
            HQ=hq, HKV=hkv, D=d, BLOCK_KV=block_kv, num_warps=4,
        )  # fmt: skip
        h2 = self._linear_residual(attn, w.o, h, bm)
        inter = mlp.down.shape[1]
        act = h.new_empty(m, inter)
        _gate_up_kernel[(triton.cdiv(inter, 32), rows)](
            h2, w.post_norm, mlp.gate_up, act, m, w.eps, H=hidden, INTER=inter,
            BLOCK_M=bm, BLOCK_N=32, BLOCK_K=64, F32=self.f32, num_warps=4, num_stages=3,
        )  # fmt: skip
        return self._linear_residual(act, mlp.down, h2, bm)

    def _linear_residual(
        self, x: torch.Tensor, weight: torch.Tensor, res: torch.Tensor, bm: int
    ) -> torch.Tensor:
        m, k = x.shape
        n = weight.shape[0]
        out = torch.empty_like(res)
        _linear_residual_kernel[(triton.cdiv(n, 16), triton.cdiv(m, bm))](
            x, weight, res, out, m, N=n, K=k,
            BLOCK_M=bm, BLOCK_N=16, BLOCK_K=128, F32=self.f32, num_warps=4, num_stages=4,
        )  # fmt: skip
        return out
