"""The code predictor's decoder layers as five Triton kernels each (CUDA; Triton's interpreter in tests).

A frame of the code predictor is 15 sequential passes through its 5 small dense layers, 75 layer
passes for a batch of at most a few dozen rows. Each pass reads ~30 MB of weights (a few microseconds
of memory time), but as torch ops, even compiled and replayed from a CUDA graph, it is ~14 kernels:
norms, rope, KV writes and residuals each their own launch between the GEMMs. Here a layer is five
kernels, the glue fused into the GEMMs' prologues and epilogues and into the attention:

1. `_gemm_kernel`: input RMSNorm and the q/k/v projection;
2. `_attention_kernel`: per request and KV head, per-head q/k RMSNorm and rope, k and v into the KV
   cache at each row's (slot, position), attention causal to the row's position;
3. `_gemm_kernel`: output projection plus the residual;
4. `_gemm_kernel`: post-attention RMSNorm, gate and up projections, SiLU(gate) * up;
5. `_gemm_kernel`: down projection plus the residual.

Rows are flat: row m is one token of one request, at KV slot `slots[m]` and position `positions[m]`,
so the frame's two-position prefill and its one-token steps are the same kernels. The math is
`fused_layers.decode_layer`'s with fp32 accumulation, rounded to the model's dtype where torch rounds
(GEMM outputs, q/k norms, attention probabilities), except that an RMSNorm before a GEMM scales the
GEMM's output by each row's 1/RMS (the statistics gathered in the same pass) and rope is rounded once.
So results match the torch layers to the dtype's rounding, not bit for bit; the engine's graphed and
eager runs both use these kernels, so those two agree exactly.

At a few dozen rows a GEMM is a weight read, fast only when every multiprocessor has loads in
flight: the default tiling computes the products transposed (the weight tile the MMA's wide operand)
and splits K over several programs for GEMMs of few column tiles. Of the tilings measured, that one
gives the fastest frame, and the kernels a faster frame than the compiled torch layers (BENCHMARKS.md
has the figures); an unsplit, untransposed tiling leaves too few programs, each waiting on its own
dependent loads.
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
def _mac(x, w_ptr, n, cols, n_ok, k_ok, acc, K: tl.constexpr, SWAP: tl.constexpr, F32: tl.constexpr):
    """acc + x [M, BK] @ W[n, cols]^T, or with SWAP its transpose acc [BN, M] + W[n, cols] @ x^T."""
    if SWAP:
        w = tl.load(w_ptr + n[:, None] * K + cols[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        acc = _dot(w, tl.trans(x), acc, F32)
    else:
        w = tl.load(w_ptr + n[None, :] * K + cols[:, None], mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc = _dot(x, w, acc, F32)
    return acc


@triton.jit
def _gemm_kernel(
    x_ptr, norm_ptr, w_ptr, res_ptr, out_ptr, ws_ptr, sem_ptr, M, eps,
    N: tl.constexpr, K: tl.constexpr, NORM: tl.constexpr, GATED: tl.constexpr, RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr,
    SWAP: tl.constexpr, F32: tl.constexpr,
):  # fmt: skip
    """out [M, N] = x @ W^T with, by the flags: x RMSNorm'd first (NORM: the row statistics gathered in
    the same pass over K and applied to the product, which they scale row by row); SiLU(x @ Wg^T) *
    (x @ Wu^T) (GATED: W = [Wg; Wu] is [2N, K]); plus res [M, N] (RESIDUAL). Products are rounded to
    the dtype before the activation and the residual, as torch rounds its GEMM outputs.

    SWAP computes the transposed products (W @ x^T), the weight tile as the MMA's first operand, which
    takes a wider tile than the few rows of x.

    SPLIT > 1 splits K over that many programs per output tile (program axis 2), so that a GEMM of few
    column tiles still has a program on every multiprocessor: each writes its fp32 partial sums to the
    workspace `ws`, and the last of a tile's programs to arrive (counted in `sem`, which it resets to 0)
    adds them in split order, so the result does not depend on the order the programs ran in."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    split = tl.program_id(2)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    n_ok = n < N
    dt = x_ptr.dtype.element_ty
    if SWAP:  # the products transposed, [N, M]: the weight tile is the MMA's wide operand
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        up = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    PART: tl.constexpr = K // SPLIT  # the caller makes it a multiple of BLOCK_K
    for k0 in range(0, PART, BLOCK_K):
        cols = split * PART + k0 + tl.arange(0, BLOCK_K)
        k_ok = cols < K
        x = tl.load(
            x_ptr + rows[:, None] * K + cols[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0
        )
        if NORM:
            xf = x.to(tl.float32)
            ss += tl.sum(xf * xf, axis=1)
            x = (xf * tl.load(norm_ptr + cols, mask=k_ok, other=0.0).to(tl.float32)[None, :]).to(dt)
        acc = _mac(x, w_ptr, n, cols, n_ok, k_ok, acc, K, SWAP, F32)
        if GATED:
            up = _mac(x, w_ptr + N * K, n, cols, n_ok, k_ok, up, K, SWAP, F32)
    if SWAP:
        acc = tl.trans(acc)
        up = tl.trans(up)
    if SPLIT == 1:
        _gemm_epilogue(acc, up, ss, rows, n, row_ok, n_ok, res_ptr, out_ptr, eps, N, K, NORM, GATED, RESIDUAL)
    else:
        # workspace: [SPLIT, tiles_m * BLOCK_M, N] of acc, then of up;
        # then [SPLIT, tiles_n, tiles_m * BLOCK_M] of ss
        m_pad = tl.num_programs(1) * BLOCK_M
        part = ws_ptr + rows[:, None] * N + n[None, :]
        ss_part = ws_ptr + 2 * SPLIT * m_pad * N + pid_n * m_pad + rows
        ss_stride = tl.num_programs(0) * m_pad
        tl.store(part + split * m_pad * N, acc, mask=n_ok[None, :])
        if GATED:
            tl.store(part + (SPLIT + split) * m_pad * N, up, mask=n_ok[None, :])
        if NORM:
            tl.store(ss_part + split * ss_stride, ss)
        tl.debug_barrier()  # every thread's partials are written before the count says so
        tile = sem_ptr + pid_m * tl.num_programs(0) + pid_n
        if tl.atomic_add(tile, 1) == SPLIT - 1:  # acq_rel: the other programs' partials are visible
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            ss = tl.zeros([BLOCK_M], dtype=tl.float32)
            for s in tl.static_range(SPLIT):
                acc += tl.load(part + s * m_pad * N, mask=n_ok[None, :], other=0.0, cache_modifier=".cg")
                if GATED:
                    up += tl.load(
                        part + (SPLIT + s) * m_pad * N, mask=n_ok[None, :], other=0.0, cache_modifier=".cg"
                    )
                if NORM:
                    ss += tl.load(ss_part + s * ss_stride, cache_modifier=".cg")
            _gemm_epilogue(
                acc, up, ss, rows, n, row_ok, n_ok, res_ptr, out_ptr, eps, N, K, NORM, GATED, RESIDUAL
            )
            tl.atomic_xchg(tile, 0)  # ready for the next GEMM (and the next replay of a graph)


@triton.jit
def _gemm_epilogue(
    acc, up, ss, rows, n, row_ok, n_ok, res_ptr, out_ptr, eps,
    N: tl.constexpr, K: tl.constexpr, NORM: tl.constexpr, GATED: tl.constexpr, RESIDUAL: tl.constexpr,
):  # fmt: skip
    """`_gemm_kernel`'s flags applied to its fp32 sums over all of K, and the tile stored."""
    dt = out_ptr.dtype.element_ty
    if NORM:
        r = tl.rsqrt(ss / K + eps)[:, None]
        acc = acc * r
        up = up * r
    y = acc.to(dt).to(tl.float32)
    if GATED:
        y = (y / (1.0 + tl.exp(-y))).to(dt).to(tl.float32) * up.to(dt).to(tl.float32)
    ok = row_ok[:, None] & n_ok[None, :]
    at = rows[:, None] * N + n[None, :]
    if RESIDUAL:
        y = y + tl.load(res_ptr + at, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + at, y.to(dt), mask=ok)


@triton.jit
def _norm_rope(lo, hi, norm_ptr, cos_ptr, sin_ptr, pos, eps, dt, D: tl.constexpr):
    """Per-head RMSNorm then rope at position `pos` of heads split in halves lo, hi [..., D/2] (fp32)."""
    HALF: tl.constexpr = D // 2
    i = tl.arange(0, HALF)
    r = tl.rsqrt((tl.sum(lo * lo, axis=-1) + tl.sum(hi * hi, axis=-1)) / D + eps)
    r = tl.expand_dims(r, -1)
    lo = ((lo * r).to(dt).to(tl.float32) * tl.load(norm_ptr + i).to(tl.float32)).to(dt).to(tl.float32)
    hi = ((hi * r).to(dt).to(tl.float32) * tl.load(norm_ptr + HALF + i).to(tl.float32)).to(dt).to(tl.float32)
    c_lo = tl.load(cos_ptr + pos * D + i).to(tl.float32)
    c_hi = tl.load(cos_ptr + pos * D + HALF + i).to(tl.float32)
    s_lo = tl.load(sin_ptr + pos * D + i).to(tl.float32)
    s_hi = tl.load(sin_ptr + pos * D + HALF + i).to(tl.float32)
    return lo * c_lo - hi * s_lo, hi * c_hi + lo * s_hi  # x * cos + rotate_half(x) * sin


@triton.jit
def _attention_kernel(
    qkv_ptr, q_norm_ptr, k_norm_ptr, cos_ptr, sin_ptr, slot_ptr, pos_ptr, k_cache_ptr, v_cache_ptr,
    out_ptr, qk_eps, scaling, cache_slot, cache_head, cache_pos,
    T: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BLOCK_KV: tl.constexpr,
):  # fmt: skip
    """One request's T rows (in position order) and one KV head per program: each row's GROUP q heads
    (normed, rotated) attend causally to the cached keys and values before the row's position and to
    the row's own k (normed, rotated) and v, which then go into the cache."""
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    dt = qkv_ptr.dtype.element_ty
    GROUP: tl.constexpr = HQ // HKV  # q heads sharing this kv head
    HALF: tl.constexpr = D // 2
    WIDTH: tl.constexpr = (HQ + 2 * HKV) * D
    i = tl.arange(0, HALF)
    d = tl.arange(0, D)
    heads = kv_head * GROUP + tl.arange(0, GROUP)
    j = tl.arange(0, BLOCK_KV)
    for t in tl.static_range(T):
        m = b * T + t
        slot = tl.load(slot_ptr + m)
        pos = tl.load(pos_ptr + m)
        row = qkv_ptr + m * WIDTH
        cache = slot * cache_slot + kv_head * cache_head
        # the keys and values before the row's position, already in the cache, load alongside the
        # row's own q, k and v (no wait on this row's cache writes; row t's on row t - 1's, below)
        before = j < pos
        at = cache + j[:, None] * cache_pos
        keys_lo = tl.load(k_cache_ptr + at + i[None, :], mask=before[:, None], other=0.0)
        keys_hi = tl.load(k_cache_ptr + at + HALF + i[None, :], mask=before[:, None], other=0.0)
        v = tl.load(v_cache_ptr + at + d[None, :], mask=before[:, None], other=0.0).to(tl.float32)
        keys_lo, keys_hi = keys_lo.to(tl.float32), keys_hi.to(tl.float32)
        k_lo = tl.load(row + (HQ + kv_head) * D + i).to(tl.float32)
        k_hi = tl.load(row + (HQ + kv_head) * D + HALF + i).to(tl.float32)
        v_row = tl.load(row + (HQ + HKV + kv_head) * D + d)
        q_lo = tl.load(row + heads[:, None] * D + i[None, :]).to(tl.float32)  # [G, D/2]
        q_hi = tl.load(row + heads[:, None] * D + HALF + i[None, :]).to(tl.float32)
        k_lo, k_hi = _norm_rope(k_lo, k_hi, k_norm_ptr, cos_ptr, sin_ptr, pos, qk_eps, dt, D)
        k_lo, k_hi = k_lo.to(dt), k_hi.to(dt)
        q_lo, q_hi = _norm_rope(q_lo, q_hi, q_norm_ptr, cos_ptr, sin_ptr, pos, qk_eps, dt, D)
        q_lo = q_lo.to(dt).to(tl.float32)
        q_hi = q_hi.to(dt).to(tl.float32)
        # the row's own key and value join at its position, as the cache will hold them
        own = (j == pos)[:, None]
        keys_lo = tl.where(own, k_lo.to(tl.float32)[None, :], keys_lo)
        keys_hi = tl.where(own, k_hi.to(tl.float32)[None, :], keys_hi)
        v = tl.where(own, v_row.to(tl.float32)[None, :], v)
        seen = j <= pos  # causal: keys up to the row's own position
        scores = tl.sum(q_lo[:, None, :] * keys_lo[None, :, :], axis=2)
        scores += tl.sum(q_hi[:, None, :] * keys_hi[None, :, :], axis=2)  # [G, KV]
        scores = scores.to(dt).to(tl.float32) * scaling
        scores = tl.where(seen[None, :], scores, float("-inf"))
        p = tl.exp(scores - tl.max(scores, axis=1)[:, None])
        p = (p / tl.sum(p, axis=1)[:, None]).to(dt).to(tl.float32)
        out = tl.sum(p[:, :, None] * v[None, :, :], axis=1)  # [G, D]
        tl.store(out_ptr + m * (HQ * D) + heads[:, None] * D + d[None, :], out.to(dt))
        tl.store(k_cache_ptr + cache + pos * cache_pos + i, k_lo)
        tl.store(k_cache_ptr + cache + pos * cache_pos + HALF + i, k_hi)
        tl.store(v_cache_ptr + cache + pos * cache_pos + d, v_row)
        if T > 1:
            tl.debug_barrier()  # this row's cache writes, read by the next row


def _block_m(m: int) -> int:
    return min(64, max(16, triton.next_power_of_2(m)))


@dataclass(frozen=True)
class KernelLayer:
    """One dense layer's weights for the kernels (`fused_layers.LayerWeights` of a dense layer)."""

    w: LayerWeights

    @property
    def mlp(self) -> DenseWeights:
        assert isinstance(self.w.mlp, DenseWeights)
        return self.w.mlp

    @property
    def head_dim(self) -> int:
        return self.w.q_norm.shape[0]

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


@dataclass(frozen=True)
class Tiles:
    """The GEMM kernels' tiling: output columns per program (>= 16), the K step, pipeline depth, warps,
    how many programs a GEMM should have at least (`programs`): one of few column tiles splits K
    over up to `max_split` programs per tile to get there (0: never split); `swap`: the products
    computed transposed (see `_gemm_kernel`). Small column tiles and
    split K: at a few dozen rows a GEMM is a weight read, fast only when spread over every
    multiprocessor."""

    # the defaults: the tiling of the fastest frame among those measured (see BENCHMARKS.md)
    block_n: int = 64
    block_k: int = 64
    stages: int = 4
    warps: int = 4
    programs: int = 128
    max_split: int = 8
    swap: bool = True

    def split(self, tiles: int, k: int) -> int:
        """K splits for a GEMM of `tiles` output tiles over K: the fewest (a power of two) that give
        `programs` programs, each still a whole number of K steps."""
        split = 1
        while (
            tiles * split < self.programs
            and split * 2 <= self.max_split
            and k % (split * 2 * self.block_k) == 0
        ):
            split *= 2
        return split

    def grid(self, m: int, n: int, k: int) -> tuple[int, int, int]:
        """The programs of a GEMM of m rows, n columns and depth k: column tiles, row tiles, K splits."""
        grid_n, grid_m = triton.cdiv(n, self.block_n), triton.cdiv(m, _block_m(m))
        return grid_n, grid_m, self.split(grid_n * grid_m, k)


class LayerKernels:
    """Runs dense decoder layers over flat rows with the five kernels (see the module docstring)."""

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor, tiles: Tiles | None = None) -> None:
        """cos, sin: [positions, head_dim], the rope of every position a row may be at."""
        self.cos = cos.contiguous()
        self.sin = sin.contiguous()
        self.tiles = tiles or Tiles()
        self.f32 = _INTERPRET
        # split-K arrival counts, one per output tile; each GEMM leaves them at 0 (the kernels of one
        # LayerKernels run on one stream, one after another)
        self._sem = torch.zeros(4096, dtype=torch.int32, device=cos.device)

    def layer(
        self,
        h: torch.Tensor,
        layer: KernelLayer,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slots: torch.Tensor,
        positions: torch.Tensor,
        rows_per_slot: int,
    ) -> torch.Tensor:
        """h [M, H] (contiguous): `rows_per_slot` consecutive rows per request, in position order; row m
        at KV slot slots[m] and position positions[m] (int32 [M]) of this layer's k/v cache
        [slots, Hkv, max_len, D] (written in place) -> the layer's output [M, H]."""
        w, mlp, d = layer.w, layer.mlp, layer.head_dim
        m = h.shape[0]
        hq, hkv = w.q_heads, w.kv_heads
        qkv = self._gemm(h, w.qkv, norm=(w.in_norm, w.eps))
        attn = h.new_empty(m, hq * d)
        _attention_kernel[(m // rows_per_slot, hkv)](
            qkv, w.q_norm, w.k_norm, self.cos, self.sin, slots, positions, k_cache, v_cache, attn,
            w.qk_eps, w.scaling, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            T=rows_per_slot, HQ=hq, HKV=hkv, D=d, BLOCK_KV=triton.next_power_of_2(k_cache.shape[2]),
            num_warps=4,
        )  # fmt: skip
        h2 = self._gemm(attn, w.o, residual=h)
        act = self._gemm(h2, mlp.gate_up, norm=(w.post_norm, w.eps), gated=True)
        return self._gemm(act, mlp.down, residual=h2)

    def _gemm(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        norm: tuple[torch.Tensor, float] | None = None,
        gated: bool = False,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        m, k = x.shape
        n = weight.shape[0] // 2 if gated else weight.shape[0]
        out = x.new_empty(m, n)
        bm, t = _block_m(m), self.tiles
        grid_n, grid_m, split = t.grid(m, n, k)
        if grid_n * grid_m > self._sem.numel():
            raise ValueError(f"a GEMM of {grid_n * grid_m} tiles (at most {self._sem.numel()})")
        ws = out  # unused unless split
        if split > 1:  # partial sums of acc and up, then the rows' sums of squares
            ws = x.new_empty(2 * split * grid_m * bm * n + split * grid_n * grid_m * bm, dtype=torch.float32)
        norm_w, eps = norm if norm is not None else (x, 0.0)
        _gemm_kernel[(grid_n, grid_m, split)](
            x, norm_w, weight, residual if residual is not None else x, out, ws, self._sem, m, eps,
            N=n, K=k, NORM=norm is not None, GATED=gated, RESIDUAL=residual is not None,
            BLOCK_M=bm, BLOCK_N=t.block_n, BLOCK_K=t.block_k, SPLIT=split, SWAP=t.swap, F32=self.f32,
            num_warps=t.warps, num_stages=t.stages,
        )  # fmt: skip
        return out
