"""The fused residual-code kernel samples as `residual_sampling.sample_residual` and gathers exactly.

On the CPU the kernel runs under Triton's interpreter, in one subprocess for the module (the
interpreter is chosen when Triton compiles, at import; `tests.support.kernel_checks.residual_code`
prints each scenario's figures); on CUDA at the full code-predictor size, eagerly and replayed from a
CUDA graph.
"""

from __future__ import annotations

import pytest
import torch

from tests.support.kernel_checks.interpreted import interpreted as run_interpreted

pytest.importorskip("triton")


@pytest.fixture(scope="module")
def interpreted() -> dict[str, dict]:
    return run_interpreted("tests.support.kernel_checks.residual_code")


def _agrees(result: dict) -> None:
    """Sampled codes as torch's but for draws within rounding of a boundary (rare: at most 1 in 20),
    greedy codes and embeddings exact; and the rows really sample (top-p keeps several codes)."""
    assert result["unexplained"] == 0, result
    assert result["near_boundary"] <= result["draws"] // 20, result
    assert result["greedy_exact"] and result["embeds_exact"], result
    assert result["min_kept"] >= 2 and result["distinct_codes"] >= 8, result


@pytest.mark.parametrize("scenario", ["sampled_2048", "small_48"])
def test_sampled_codes_match_torch_on_tie_free_logits(interpreted: dict[str, dict], scenario: str) -> None:
    """fp32 rows of 2048 and of 48 codes (fewer than top-k's 50: k = V; not a power of two), each
    drawn at u from 0 to just below 1, every fifth row greedy; the code written into a column of a
    [B, 15] tensor, the others untouched."""
    _agrees(interpreted[scenario])
    assert interpreted[scenario]["written_in_place"]


@pytest.mark.parametrize("scenario", ["bf16_2000", "bf16_16"])
def test_bfloat16_logits_give_torch_codes(interpreted: dict[str, dict], scenario: str) -> None:
    _agrees(interpreted[scenario])


@pytest.mark.parametrize("scenario", ["greedy_ties", "greedy_ties_bf16"])
def test_greedy_ties_take_the_first_index(interpreted: dict[str, dict], scenario: str) -> None:
    """float32 logits take 64-bit sort keys, bfloat16 ones 32-bit keys: both break ties alike."""
    result = interpreted[scenario]
    assert result["codes"] == [7, 0, 2, 1998]  # repeated max; all equal; -0.0 before +0.0; two +inf
    assert result["codes"] == result["torch_codes"] and result["embeds_exact"]


@pytest.mark.parametrize("scenario", ["sampled_ties", "sampled_ties_bf16"])
def test_sampled_ties_rank_the_smaller_index_as_more_likely(
    interpreted: dict[str, dict], scenario: str
) -> None:
    """16 equal logits: ascending order is 15, 14, .., 0; top-p drops 15, 14, 13 (cumulative 1/16,
    2/16, 3/16 <= 0.2); u = 0, 0.5 and just below 1 pick the first, the 7th and the last kept."""
    assert interpreted[scenario] == [12, 6, 0]


def test_residual_code_computes_the_head_then_samples(interpreted: dict[str, dict]) -> None:
    result = interpreted["wrapper"]
    _agrees(result)
    assert result["torch_embeds_where_codes_agree"]


def _full_size_inputs(seed: int) -> dict[str, torch.Tensor]:
    """B = 32, V = 2048, H = 1024, bfloat16: a one-hot hidden picks a tie-free column of the head, so
    the logits are exact and tie-free; every fourth row greedy."""
    from tests.support.kernel_checks.residual_code import distinct_logits, uniforms

    g = torch.Generator().manual_seed(seed)
    b, v, h = 32, 2048, 1024
    head = distinct_logits(b, v, torch.bfloat16, g)
    columns = torch.randperm(h, generator=g)[:b]
    full = torch.randn(v, h, generator=g).to(torch.bfloat16)
    full[:, columns] = head.T
    hidden = torch.nn.functional.one_hot(columns, h).to(torch.bfloat16)
    x = {"hidden": hidden, "head": full, "table": torch.randn(v, h, generator=g).to(torch.bfloat16)}
    x = {k: t.cuda() for k, t in x.items()}
    return {**x, "u": uniforms(b, g).cuda(), "greedy": (torch.arange(b) % 4 == 3).cuda()}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_full_size_on_cuda_eager_and_from_a_cuda_graph() -> None:
    from omnivoice.runners.residual_code_kernel import residual_code
    from tests.support.kernel_checks.residual_code import agreement

    static = _full_size_inputs(0)
    residual_code(**static)  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graphed = residual_code(**static)
    for seed in range(4):  # new inputs copied into the captured ones, then a replay
        x = _full_size_inputs(seed)
        for name, t in x.items():
            static[name].copy_(t)
        graph.replay()
        code, embed = residual_code(**x)
        assert torch.equal(graphed[0], code) and torch.equal(graphed[1], embed)
        logits = torch.nn.functional.linear(x["hidden"], x["head"])
        result = agreement(logits, x["u"], x["greedy"], code, embed, x["table"])
        assert result["unexplained"] == 0 and result["near_boundary"] <= 2, result
        assert result["greedy_exact"] and result["embeds_exact"] and result["not_argmax"] >= 4, result


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sampled_codes_match_torch_on_cuda(dtype: torch.dtype) -> None:
    """The interpreter's scenario compiled, for both kinds of sort key: 32 rows drawn 32 times each."""
    from tests.support.kernel_checks.residual_code import sampled

    result = sampled(2048, dtype, rows=32, draws=32, h=1024, seed=7, device="cuda")
    _agrees(result)
    assert result["written_in_place"]
