"""The residual codebooks' sampling as torch ops: the code predictor's head logits -> one code a row.

transformers' generate() samples codebooks 1..G-1 with top-k `TOP_K` then top-p `TOP_P` at
temperature 1 when the talker samples. `sample_residual` draws from exactly that distribution by
inverse CDF with a given uniform per row, so a draw is a fixed-shape function of device tensors (no
host sync, capturable in a CUDA graph). `residual_code_kernel` is the same sampling as one Triton
kernel and takes its constants from here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# transformers' generate() samples the residual codebooks with these when the talker samples
TOP_K = 50
TOP_P = 0.8


def residual_code(
    hidden: torch.Tensor, head: torch.Tensor, table: torch.Tensor, u: torch.Tensor, greedy: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden [B, H] -> a residual code [B] (its head's logits sampled as `sample_residual`) and its
    embedding [B, H] from `table`."""
    code = sample_residual(F.linear(hidden, head), u, greedy)
    return code, F.embedding(code, table)


def sample_residual(logits: torch.Tensor, u: torch.Tensor, greedy: torch.Tensor) -> torch.Tensor:
    """One residual code per row: argmax where `greedy`, else `draw_residual` with the row's uniform
    `u` [B]. Device ops only (a handful of tiny kernels per code)."""
    return torch.where(greedy, logits.argmax(-1), draw_residual(logits, u))


def draw_residual(logits: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One code per row drawn from transformers' top-k 50 then top-p 0.8 at temperature 1, by inverse
    CDF with the row's uniform `u` [B]; on the 50 best codes rather than the whole codebook."""
    scores = logits.float()
    top, index = torch.topk(scores, min(TOP_K, scores.shape[-1]), dim=-1)  # descending
    top, index = top.flip(-1), index.flip(-1)  # ascending, as transformers' top-p sorts
    cum = top.softmax(-1).cumsum(-1)
    drop = cum <= (1 - TOP_P)
    drop[:, -1] = False  # always keep the most likely code
    cdf = top.masked_fill(drop, float("-inf")).softmax(-1).cumsum(-1)  # [B, K]
    pick = torch.searchsorted(cdf, (u[:, None] * cdf[:, -1:]).contiguous(), right=True)
    return index.gather(1, pick.clamp_max(cdf.shape[-1] - 1))[:, 0]
