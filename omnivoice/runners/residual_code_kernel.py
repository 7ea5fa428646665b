"""A code-predictor step's residual code as one Triton kernel: sampling and embedding gather fused.

Each of a frame's 15 steps turns the head's logits [B, V] into a code per row (argmax, or top-k 50
then top-p 0.8 drawn by inverse CDF as `residual_sampling.sample_residual`) and gathers its embedding.
As torch ops that is ~17 tiny kernels, a step that costs what their launches cost. Here the head
stays a cuBLAS GEMM and everything after it is `_residual_code_kernel`, one program per row:

1. the row's logits (fp32) become integer sort keys: the float bits mapped to a signed integer of
   the same order (negative: all bits but the sign flipped) in the upper half, BLOCK_V - 1 - index
   in the lower, so equal logits rank the smaller index higher (`torch.argmax`'s rule); padded lanes
   are -inf with larger indices, so they rank below every real code. bfloat16 logits (the model's)
   take 32-bit keys from their 16 bits, others 64-bit keys from the fp32 bits (the sort's
   compare-and-swaps, most of the kernel's work, are cheaper on the narrower keys);
2. a bitonic top-k of the keys (`_top_ascending`): the T = next_power_of_2(K) largest, ascending, so
   the top K are the lanes r >= T - K, in `sample_residual`'s flipped order, and the last lane is the
   greedy code;
3. softmax and `tl.cumsum` over the top lanes; top-p drops those whose cumulative probability is
   <= 1 - 0.8 except the last lane; softmax and cumsum again give the CDF, and the pick is the lowest
   top lane whose CDF exceeds u * CDF[last] (the last lane if none: searchsorted clamped to K - 1);
4. the code is written, and the code's row of the embedding table copied to the output.

The sums run in another order than torch's, so a draw whose u * total lies within rounding of a CDF
boundary, or a row whose cumulative probability lies within rounding of 1 - 0.8, may pick the
neighbouring code; everything else matches `sample_residual` exactly. Among equal logits torch.topk's
order is unspecified; here the smaller index counts as the more likely, for greedy and sampled rows.

A step is then two kernels (the GEMM and this one) instead of ~17, and a frame with the layer
kernels is faster than with the torch sampling at every batch size measured (BENCHMARKS.md has the
figures).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from omnivoice.runners.residual_sampling import TOP_K, TOP_P

_BLOCK_H = 256  # embedding columns copied per loop iteration


@triton.jit
def _indicator(N_DIMS: tl.constexpr, j: tl.constexpr):
    """0 or 1 along dimension N_DIMS - 1 - j of a [2] * N_DIMS hypercube (its j-th bit from the right)."""
    return tl.reshape(tl.arange(0, 2), [1] * (N_DIMS - j - 1) + [2] + [1] * j)


@triton.jit
def _bitonic_merge(h, stage: tl.constexpr, order: tl.constexpr, N_DIMS: tl.constexpr):
    """`stage` compare-and-swap rounds over a [2] * N_DIMS hypercube: runs of 2**stage sorted ascending
    (order 0) or alternately ascending and descending (order 2). Each round swaps along one dimension
    by its min and max (Triton's own sort takes an xor reduction, which its interpreter runs element
    by element: far too slow for the CPU tests)."""
    flip = _indicator(N_DIMS, stage) if order == 2 else 0
    for r in tl.static_range(stage):  # bit stage - 1 - r: dimension N_DIMS - stage + r
        right = _indicator(N_DIMS, stage - 1 - r) ^ flip
        lo = tl.min(h, axis=N_DIMS - stage + r, keep_dims=True)
        h = tl.where(right != 0, tl.max(h, axis=N_DIMS - stage + r, keep_dims=True), lo)
    return h


@triton.jit
def _top_ascending(x, LOG_N: tl.constexpr, LOG_T: tl.constexpr):
    """The 2**LOG_T largest of x [2**LOG_N], ascending: bitonic top-k (Triton 3.9's `sort_impl`):
    sort runs of 2**LOG_T, then halve by the pairwise max of neighbouring runs (the larger half of an
    ascending and a descending run) and merge again, until one run is left. Cheaper than a full
    `tl.sort`: merges never grow past runs of 2**LOG_T, and each halving drops half the keys."""
    h = tl.reshape(x, [2] * LOG_N)
    for i in tl.static_range(1, LOG_T + 1):
        h = _bitonic_merge(h, i, 2 if i < LOG_N else 0, LOG_N)
    for i in tl.static_range(LOG_T + 1, LOG_N + 1):  # h: LOG_N + LOG_T + 1 - i dimensions, one fewer after
        h = tl.max(h, axis=LOG_N - i)
        h = _bitonic_merge(h, LOG_T, 2 if i < LOG_N else 0, LOG_N + LOG_T - i)
    return tl.reshape(h, [2**LOG_T])


@triton.jit
def _residual_code_kernel(
    logits_ptr, logits_stride, u_ptr, u_stride, greedy_ptr, greedy_stride, table_ptr, table_stride,
    code_ptr, code_stride, embed_ptr, embed_stride,
    V: tl.constexpr, H: tl.constexpr, K: tl.constexpr, TOP_P: tl.constexpr, LOG_V: tl.constexpr,
    LOG_T: tl.constexpr, BLOCK_H: tl.constexpr, BF16: tl.constexpr,
):  # fmt: skip
    """Row b: code[b * code_stride] (int64) and embed[b, :H] = table[code, :H] (see the module doc)."""
    b = tl.program_id(0)
    BLOCK_V: tl.constexpr = 2**LOG_V
    T: tl.constexpr = 2**LOG_T  # the top K sit in the last K of T lanes
    lane = tl.arange(0, BLOCK_V)
    x = tl.load(logits_ptr + b * logits_stride + lane, mask=lane < V, other=float("-inf")).to(tl.float32)
    x = tl.where(x == 0.0, 0.0, x)  # -0.0 ties +0.0, as in torch's comparisons
    bits = x.to(tl.int32, bitcast=True)
    if BF16:  # the bfloat16 bits (the float32's upper half), sign-extended
        half = bits >> 16
        key = ((half ^ ((half >> 15) & 0x7FFF)) << 16) | (BLOCK_V - 1 - lane)
    else:
        ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # signed integer order = float order
        key = (ordered.to(tl.int64) << 32) | (BLOCK_V - 1 - lane).to(tl.int64)
    key = _top_ascending(key, LOG_V, LOG_T)
    if BF16:
        index = BLOCK_V - 1 - (key & 0xFFFF)
        half = key >> 16
        value = ((half ^ ((half >> 15) & 0x7FFF)) << 16).to(tl.float32, bitcast=True)  # ascending logits
    else:
        index = BLOCK_V - 1 - (key & 0xFFFFFFFF).to(tl.int32)
        high = (key >> 32).to(tl.int32)
        value = (high ^ ((high >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)

    rank = tl.arange(0, T)
    last = rank == T - 1  # the most likely code
    top = rank >= T - K
    e = tl.exp(value - tl.max(value, axis=0))
    p = tl.where(top, e, 0.0)
    cum = tl.cumsum(p / tl.sum(p, axis=0), axis=0)
    q = tl.where(top & ((cum > 1 - TOP_P) | last), e, 0.0)
    cdf = tl.cumsum(q / tl.sum(q, axis=0), axis=0)
    target = tl.load(u_ptr + b * u_stride).to(tl.float32) * tl.max(cdf, axis=0)
    pick = tl.min(tl.where(top & (cdf > target), rank, T - 1), axis=0)
    pick = tl.where(tl.load(greedy_ptr + b * greedy_stride) != 0, T - 1, pick)
    code = tl.sum(tl.where(rank == pick, index, 0), axis=0)
    tl.store(code_ptr + b * code_stride, code.to(tl.int64))

    row = table_ptr + code.to(tl.int64) * table_stride
    for h0 in range(0, H, BLOCK_H):
        cols = h0 + tl.arange(0, BLOCK_H)
        ok = cols < H
        tl.store(embed_ptr + b * embed_stride + cols, tl.load(row + cols, mask=ok), mask=ok)


def sample_embed(
    logits: torch.Tensor,
    table: torch.Tensor,
    u: torch.Tensor,
    greedy: torch.Tensor,
    code_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, V] (any float dtype), table [V, H], u [B] (float32), greedy [B] (bool) -> code [B]
    (int64; written into `code_out` [B] when given, e.g. a column of a [B, G-1] codes tensor) and its
    embedding [B, H] from `table`. One kernel launch, no host sync: CUDA-graph capturable."""
    b, v = logits.shape
    h = table.shape[1]
    if logits.stride(1) != 1 or table.stride(1) != 1 or v < 2:
        raise ValueError(f"logits and table rows must be contiguous, of 2 codes or more (V = {v})")
    code = torch.empty(b, dtype=torch.int64, device=logits.device) if code_out is None else code_out
    embed = table.new_empty(b, h)
    k = min(TOP_K, v)
    _residual_code_kernel[(b,)](
        logits, logits.stride(0), u, u.stride(0), greedy, greedy.stride(0), table, table.stride(0),
        code, code.stride(0), embed, embed.stride(0), V=v, H=h, K=k, TOP_P=TOP_P,
        LOG_V=_log2(v), LOG_T=_log2(k), BLOCK_H=min(_BLOCK_H, triton.next_power_of_2(h)),
        BF16=logits.dtype == torch.bfloat16 and v <= 2**16, num_warps=4,
    )  # fmt: skip
    return code, embed


def _log2(n: int) -> int:
    """log2 of the smallest power of two >= n."""
    return (n - 1).bit_length()


def residual_code(
    hidden: torch.Tensor, head: torch.Tensor, table: torch.Tensor, u: torch.Tensor, greedy: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`residual_sampling.residual_code` with the sampling and gather fused: hidden [B, H] -> a residual
    code [B] (the head's logits, a cuBLAS GEMM, sampled as `sample_residual`) and its embedding [B, H]."""
    return sample_embed(F.linear(hidden, head), table, u, greedy)
