"""The code predictor's exact-shape CPU frame gives the fixed-shape frame's codes, and its hidden
states are those of transformers' own code predictor forward bit for bit."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import DynamicCache

from omnivoice.bench.kernel_check import build
from omnivoice.runners import predictor_exact
from omnivoice.runners.code_predictor import CodePredictor
from omnivoice.runners.residual_sampling import residual_code

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def module() -> Any:
    return build(small=True, device="cpu").float()


def _inputs(batch: int, hidden: int, greedy: torch.Tensor, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "talker_hidden": torch.randn(batch, hidden, generator=g) * 3,
        "code0_embed": torch.randn(batch, hidden, generator=g) * 3,
        "uniforms": torch.rand(batch, 15, generator=g),
        "greedy": greedy,
    }


def test_the_cpu_default_runs_exact_frames(module: Any) -> None:
    assert CodePredictor(module, 4, CPU).exact is not None
    assert CodePredictor(module, 4, CPU, exact=False).exact is None
    with pytest.raises(ValueError, match="never captured"):
        CodePredictor(module, 4, CPU, graphs=True, exact=True)


@pytest.mark.parametrize("kind", ["greedy", "sampled", "mixed"])
@pytest.mark.parametrize("batch", [1, 3, 4])
def test_exact_frames_give_the_fixed_shape_frames_codes(module: Any, kind: str, batch: int) -> None:
    fixed, exact = CodePredictor(module, 4, CPU, exact=False), CodePredictor(module, 4, CPU)
    greedy = {"greedy": torch.ones(batch), "sampled": torch.zeros(batch), "mixed": torch.arange(batch) % 2}
    hidden = module.config.hidden_size
    with torch.inference_mode():
        for seed in range(4):  # frame after frame: each one overwrites the scratch cache's rows
            x = _inputs(batch, hidden, greedy[kind].bool(), seed)
            want, got = fixed.predict(**x), exact.predict(**x)
            assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])


def test_exact_frame_states_are_transformers_forward_bit_for_bit(module: Any) -> None:
    frame = CodePredictor(module, 2, CPU).exact
    assert frame is not None
    hidden = module.config.hidden_size
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        x = torch.randn(1, 2, hidden, generator=g)
        cache = DynamicCache(config=module.config)
        want = module.model(inputs_embeds=x, cache=cache, use_cache=True).last_hidden_state[:, -1]
        assert torch.equal(frame.first(x), want)
        for k in range(14):
            embed = torch.randn(1, hidden, generator=g)
            want = module.model(inputs_embeds=embed[:, None], cache=cache, use_cache=True).last_hidden_state
            assert torch.equal(frame.step(embed, k), want[:, -1]), k


def test_each_frame_picks_only_what_its_rows_need() -> None:
    g = torch.Generator().manual_seed(0)
    hidden, head, table = torch.randn(4, 8, generator=g), torch.randn(64, 8, generator=g), torch.randn(64, 8)
    u = torch.rand(4, generator=g)
    for greedy in ([True] * 4, [False] * 4, [True, False, False, True]):
        mask = torch.tensor(greedy)
        code, embed = predictor_exact.code_fn(mask)(hidden, head, table, u, mask)
        want, want_embed = residual_code(hidden, head, table, u, mask)
        assert torch.equal(code, want) and torch.equal(embed, want_embed)
    assert predictor_exact.code_fn(torch.ones(2, dtype=torch.bool)) is predictor_exact._argmax_code
    assert predictor_exact.code_fn(torch.zeros(2, dtype=torch.bool)) is predictor_exact._drawn_code
