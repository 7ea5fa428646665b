"""The fused residual-code kernel against `residual_sampling.sample_residual` and `residual_code`.

Run by tests/runners/test_residual_code_kernel.py: in a subprocess under Triton's interpreter on the
CPU (the interpreter is chosen when Triton compiles the kernel), whose last stdout line is a dict of
each scenario's figures; the CUDA tests call `agreement` in-process. Also `python -m` runnable:

    TRITON_INTERPRET=1 python -m tests.support.kernel_checks.residual_code
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from omnivoice.runners import residual_sampling
from omnivoice.runners.residual_code_kernel import residual_code, sample_embed

# a draw may pick the neighbouring code when u * total lies this close to a CDF boundary (or a row's
# cumulative probability this close to 1 - top-p): the kernel sums in another order than torch
TOLERANCE = 1e-5
TOP_P = 0.8
LAST_BELOW_ONE = 1 - 2**-24  # the largest float32 below 1


def distinct_logits(
    rows: int, v: int, dtype: torch.dtype, g: torch.Generator, scale: float = 2.0
) -> torch.Tensor:
    """[rows, v] logits with no two equal in a row, exactly representable in `dtype`: a random
    permutation of distinct normal draws, each at a scale of `scale` / 2**0..15 (so bfloat16 has
    enough distinct values; the few at full scale keep several codes after top-p 0.8)."""
    out = torch.empty(rows, v, dtype=dtype)
    for r in range(rows):
        shrink = 2.0 ** -torch.randint(0, 16, (8 * v,), generator=g)
        values = torch.unique((torch.randn(8 * v, generator=g) * scale * shrink).to(dtype))
        out[r] = values[torch.randperm(values.numel(), generator=g)[:v]]
    return out


def uniforms(n: int, g: torch.Generator) -> torch.Tensor:
    """n draws in [0, 1): the ends (0, the smallest normal float32, the largest float32 below 1) and
    random ones."""
    ends = torch.tensor([0.0, 2**-126, LAST_BELOW_ONE, 0.5])
    return torch.cat([ends, torch.rand(n, generator=g)])[:n]


def repeat_rows(logits: torch.Tensor, draws: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row repeated `draws` times, each copy with its own uniform: (logits [R * draws, V], u)."""
    u = torch.cat([uniforms(draws, g) for _ in range(logits.shape[0])])
    return logits.repeat_interleave(draws, dim=0), u


def near_boundary(logits: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """[B] bool: the row's draw lies within TOLERANCE of an interior CDF boundary, or a cumulative
    probability of its top-k within TOLERANCE of 1 - top-p (float64, as sample_residual computes)."""
    k = min(50, logits.shape[-1])
    top = torch.topk(logits.double(), k, dim=-1).values.flip(-1)  # ascending
    cum = top.softmax(-1).cumsum(-1)
    near_drop = ((cum[:, :-1] - (1 - TOP_P)).abs() < TOLERANCE).any(-1)
    keep = cum > 1 - TOP_P
    keep[:, -1] = True
    cdf = top.masked_fill(~keep, float("-inf")).softmax(-1).cumsum(-1)
    near_cdf = (((cdf[:, :-1] - u.double()[:, None]).abs() < TOLERANCE) & keep[:, :-1]).any(-1)
    return near_drop | near_cdf


def kept(logits: torch.Tensor) -> torch.Tensor:
    """[B] how many codes top-k then top-p keeps in each row."""
    top = torch.topk(logits.double(), min(50, logits.shape[-1]), dim=-1).values.flip(-1)
    keep = top.softmax(-1).cumsum(-1) > 1 - TOP_P
    keep[:, -1] = True
    return keep.sum(-1)


def agreement(
    logits: torch.Tensor,
    u: torch.Tensor,
    greedy: torch.Tensor,
    codes: torch.Tensor,
    embeds: torch.Tensor,
    table: torch.Tensor,
) -> dict[str, object]:
    """The kernel's codes and embeddings against sample_residual's codes on the same inputs. Sampled
    rows may differ only near a boundary (`near_boundary`); greedy rows and embeddings must be exact."""
    want = residual_sampling.sample_residual(logits, u, greedy)
    near = near_boundary(logits.float(), u.float()) & ~greedy
    wrong = codes != want
    sampled = ~greedy
    return {
        "draws": int(sampled.sum()),
        "mismatched": int(wrong.sum()),
        "unexplained": int((wrong & ~near).sum()),  # must be 0
        "near_boundary": int(near.sum()),
        "greedy_exact": bool(torch.equal(codes[greedy], logits[greedy].argmax(-1))),
        "embeds_exact": bool(torch.equal(embeds, table[codes])),
        "min_kept": int(kept(logits.float())[sampled].min()) if sampled.any() else 0,
        "distinct_codes": int(codes[sampled].unique().numel()),
        "not_argmax": int((codes != logits.argmax(-1))[sampled].sum()),  # sampled, not greedy
    }


def sampled(
    v: int, dtype: torch.dtype, rows: int, draws: int, h: int, seed: int, device: str = "cpu"
) -> dict[str, object]:
    """Tie-free rows, each drawn `draws` times (u from 0 to just below 1), every 5th row greedy; the
    code written into a column of a [B, 15] codes tensor and u read from a column of [B, 3]."""
    g = torch.Generator().manual_seed(seed)
    logits, u = repeat_rows(distinct_logits(rows, v, dtype, g), draws, g)
    b = logits.shape[0]
    greedy = torch.arange(b) % 5 == 4
    table = torch.randn(v, h, generator=g).to(dtype)
    u_columns = torch.rand(b, 3, generator=g)
    u_columns[:, 1] = u
    logits, u, greedy, table, u_columns = (t.to(device) for t in (logits, u, greedy, table, u_columns))
    codes = torch.full((b, 15), -1, dtype=torch.int64, device=device)
    code, embeds = sample_embed(logits, table, u_columns[:, 1], greedy, code_out=codes[:, 7])
    others_untouched = bool((codes[:, :7] == -1).all() and (codes[:, 8:] == -1).all())
    return {
        **agreement(logits, u, greedy, codes[:, 7], embeds, table),
        "written_in_place": bool(code.data_ptr() == codes[:, 7].data_ptr() and others_untouched),
    }


def greedy_ties(dtype: torch.dtype) -> dict[str, object]:
    """Greedy rows whose maximum occurs more than once (and -0.0 beside +0.0): the first index wins."""
    logits = (torch.randn(4, 2000, generator=torch.Generator().manual_seed(3)) - 10).to(dtype)
    logits[0, [7, 300, 1999]] = 5.0
    logits[1] = 1.0  # all equal
    logits[2, [2, 5]] = torch.tensor([-0.0, 0.0], dtype=dtype)
    logits[3, [1998, 1999]] = float("inf")
    table = torch.randn(2000, 8).to(dtype)
    greedy = torch.ones(4, dtype=torch.bool)
    codes, embeds = sample_embed(logits, table, torch.full((4,), 0.5), greedy)
    return {
        "codes": codes.tolist(),
        "torch_codes": residual_sampling.sample_residual(logits, torch.full((4,), 0.5), greedy).tolist(),
        "embeds_exact": bool(torch.equal(embeds, table[codes])),
    }


def sampled_ties(dtype: torch.dtype) -> list[int]:
    """Sampled codes of a row of 16 equal logits at u = 0, 0.5 and just below 1 (the tie rule: a
    smaller index counts as more likely)."""
    logits = torch.zeros(3, 16, dtype=dtype)
    u = torch.tensor([0.0, 0.5, LAST_BELOW_ONE])
    codes, _ = sample_embed(logits, torch.zeros(16, 4, dtype=dtype), u, torch.zeros(3, dtype=torch.bool))
    return codes.tolist()


def wrapper(seed: int = 5) -> dict[str, object]:
    """`residual_code` (head GEMM then the kernel) against residual_sampling's: a one-hot hidden picks a
    column of the head, so the logits are that column exactly (tie-free), whatever the GEMM's order."""
    g = torch.Generator().manual_seed(seed)
    v, h, b = 256, 64, 32
    head = distinct_logits(h, v, torch.float32, g).T.contiguous()  # [V, H]: column j tie-free
    hidden = F.one_hot(torch.randperm(h, generator=g)[:b], h).float()
    u, greedy = uniforms(b, g), torch.arange(b) % 4 == 3
    table = torch.randn(v, h, generator=g)
    code, embed = residual_code(hidden, head, table, u, greedy)
    want_code, want_embed = residual_sampling.residual_code(hidden, head, table, u, greedy)
    logits = F.linear(hidden, head)
    return {
        **agreement(logits, u, greedy, code, embed, table),
        "torch_embeds_where_codes_agree": bool(
            torch.equal(embed[code == want_code], want_embed[code == want_code])
        ),
    }


def main() -> None:
    print(
        {
            # rows of the real vocabulary's size are few: the interpreter runs each program on the CPU
            "sampled_2048": sampled(2048, torch.float32, rows=3, draws=10, h=96, seed=0),
            "bf16_2000": sampled(2000, torch.bfloat16, rows=2, draws=10, h=64, seed=1),
            "small_48": sampled(48, torch.float32, rows=6, draws=12, h=16, seed=2),
            "bf16_16": sampled(16, torch.bfloat16, rows=4, draws=12, h=16, seed=4),
            "greedy_ties": greedy_ties(torch.float32),
            "greedy_ties_bf16": greedy_ties(torch.bfloat16),
            "sampled_ties": sampled_ties(torch.float32),
            "sampled_ties_bf16": sampled_ties(torch.bfloat16),
            "wrapper": wrapper(),
        }
    )


if __name__ == "__main__":
    main()
