"""The code predictor's device sampler draws from exactly transformers' top-k 50 / top-p 0.8 distribution."""

from __future__ import annotations

import torch
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from omnivoice.runners.residual_sampling import sample_residual


def test_inverse_cdf_over_a_uniform_grid_reproduces_transformers_probabilities() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 2048) * 3
    n = 20_000
    u = (torch.arange(n, dtype=torch.float32) + 0.5) / n  # evenly spread draws
    for row in logits:
        scores = TopPLogitsWarper(0.8)(None, TopKLogitsWarper(50)(None, row[None].clone()))
        expected = scores.softmax(-1)[0]
        codes = sample_residual(row[None].expand(n, -1), u, torch.zeros(n, dtype=torch.bool))
        observed = torch.bincount(codes, minlength=row.shape[0]).float() / n
        assert set(codes.tolist()) == set(torch.nonzero(expected).flatten().tolist())
        assert (observed - expected).abs().max() < 2 / n + 1e-5


def test_greedy_rows_take_the_argmax() -> None:
    logits = torch.randn(4, 2048)
    greedy = torch.tensor([True, False, True, False])
    codes = sample_residual(logits, torch.full((4,), 0.3), greedy)
    assert codes[0] == logits[0].argmax() and codes[2] == logits[2].argmax()
    assert codes[1] in torch.topk(logits[1], 50).indices
