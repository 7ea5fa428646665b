"""The code predictor's Triton layer kernels give the torch layers' outputs and codes.

On the CPU they run under Triton's interpreter (a subprocess: the interpreter is chosen when Triton
compiles the kernels, at import); on CUDA at the full Qwen3-Omni size, eagerly and from CUDA graphs.
"""

from __future__ import annotations

import pytest
import torch

from tests.support.kernel_checks.interpreted import interpreted

pytest.importorskip("triton")


def _check(result: dict[str, object], tolerance: float) -> None:
    errors = result["step_rel_errors"]
    assert isinstance(errors, list) and len(errors) == 15
    assert max(errors) < tolerance, result  # bfloat16 rounding, not a wrong formula (those give > 0.1)
    # greedy codes agree but for near-ties that rounding can flip (random weights give flat logits)
    assert isinstance(result["argmax_agree"], float) and result["argmax_agree"] >= 0.9, result


def _check_gemms(result: dict[str, object], split: bool) -> None:
    """Each GEMM within bfloat16 rounding of float32 torch, K split or not; `split`: every GEMM of the
    check was split. The split-K arrival counts are back at 0 after each GEMM (a count left behind
    would make the next GEMM's tiles finish early) and a second run gives the same bits."""
    errors, gap, splits = result["gemm_rel_errors"], result["split_vs_whole"], result["splits"]
    assert isinstance(errors, dict) and isinstance(gap, dict) and isinstance(splits, dict)
    assert len(errors) >= 12 and max(errors.values()) < 0.03, result
    assert max(gap.values()) < 0.01, result  # the same sums, added in another order
    if split:
        assert min(splits.values()) > 1, result
    assert result["counts_clear"] is True and result["repeatable"] is True, result


def _interpret(*args: str) -> dict[str, object]:
    return interpreted("omnivoice.bench.kernel_check", *args)


def test_kernels_match_the_torch_layers_under_the_interpreter() -> None:
    _check(_interpret("--batch", "8"), 0.03)


@pytest.mark.parametrize("swap", [False, True], ids=["products", "transposed-products"])
def test_gemms_split_over_k_match_torch_under_the_interpreter(swap: bool) -> None:
    _check_gemms(_interpret("--gemms", *(["--swap"] if swap else [])), split=True)


def test_unsupported_layers_are_refused_when_kernels_are_required() -> None:
    from omnivoice.bench.kernel_check import build
    from omnivoice.runners.code_predictor import CodePredictor

    module = build(small=True, device="cpu").float()  # float32: the kernels take bf16 and fp16 only
    with pytest.raises(ValueError, match="float32"):
        CodePredictor(module, 2, torch.device("cpu"), kernels=True)
    assert CodePredictor(module, 2, torch.device("cpu"), kernels=None).kernels is None


def test_kernels_that_fail_at_start_leave_the_torch_layers_or_raise_when_required(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A GPU or Triton that cannot compile the kernels is found by a trial at start: the default
    falls back to the torch layers with a warning; kernels required raise."""
    from omnivoice.bench.kernel_check import build
    from omnivoice.runners import predictor_kernels
    from omnivoice.runners.code_predictor import CodePredictor

    def broken(*args: object) -> None:
        raise RuntimeError("no kernel image for this GPU")

    monkeypatch.setattr(predictor_kernels.LayerKernels, "layer", broken)
    module = build(small=True, device="cpu")
    predictor = CodePredictor(module, 2, torch.device("cpu"), kernels=False)
    predictor.stack.fuse()  # as on a GPU
    with caplog.at_level("WARNING", logger="omnivoice.runners.code_predictor"):
        assert predictor._layer_kernels(None, 2) is None
    assert "the kernels failed: RuntimeError: no kernel image" in caplog.text
    with pytest.raises(RuntimeError, match="no kernel image"):
        CodePredictor(module, 2, torch.device("cpu"), kernels=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_kernels_match_the_torch_layers_at_full_size_on_cuda() -> None:
    from omnivoice.bench.kernel_check import compare

    _check(compare(small=False, device="cuda", batch=32), 0.03)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("swap", [False, True], ids=["products", "transposed-products"])
def test_full_size_gemms_match_torch_on_cuda(swap: bool) -> None:
    from omnivoice.bench.kernel_check import gemms
    from omnivoice.runners.predictor_kernels import Tiles

    # the default tiling is transposed; the plain products at step 6's tiling
    tiles = Tiles() if swap else Tiles(block_n=32, block_k=128, swap=False)
    result = gemms("full", "cuda", (1, 8, 32), tiles)
    _check_gemms(result, split=False)
    splits = result["splits"]
    assert isinstance(splits, dict) and splits["o m=32"] > 1 and splits["down m=32"] > 1, result


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_kernel_frames_replay_from_cuda_graphs_as_they_run_eagerly() -> None:
    from omnivoice.bench.kernel_check import build, inputs
    from omnivoice.runners.code_predictor import CodePredictor

    module = build(small=False, device="cuda")
    device = torch.device("cuda")
    eager = CodePredictor(module, 8, device, graphs=False, kernels=True)
    graphed = CodePredictor(module, 8, device, graphs=True, kernels=True)
    for batch in (1, 8):
        x = inputs(batch, module.config.hidden_size, "cuda", seed=batch)
        x["greedy"][::2] = False  # sampled rows too
        with torch.inference_mode():
            want = eager.predict(**x)
            for _ in range(2):  # the capture, then a replay
                got = graphed.predict(**x)
                assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
