"""CUDA graphs of different stages replayed at the same time on their own streams (GPU only)."""

from __future__ import annotations

import threading

import pytest
import torch

from omnivoice.runners.graphs import StepGraphs

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")

ROWS, WIDTH, LAYERS = 64, 4096, 4  # a decode step's GEMMs at a wide batch bucket


def _stack(seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return tuple(
        torch.randn(WIDTH, WIDTH, generator=g, device="cuda", dtype=torch.bfloat16) / WIDTH**0.5
        for _ in range(LAYERS)
    )


def _step(weights: tuple[torch.Tensor, ...]):
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        for w in weights:
            x = torch.tanh(x @ w)
        return (x,)

    return fn


@cuda
def test_each_graph_family_captures_on_a_stream_of_its_own() -> None:
    a, b = StepGraphs(_step(_stack(0)), "a", True), StepGraphs(_step(_stack(1)), "b", True)
    x = torch.zeros(ROWS, WIDTH, device="cuda", dtype=torch.bfloat16)
    a(ROWS, {"x": x})
    b(ROWS, {"x": x})
    assert a._streams is not None and b._streams is not None
    # cuBLAS's workspace is per (handle, stream): a shared capture stream would share it
    assert a._streams[1] != b._streams[1]


@cuda
def test_graphs_replayed_side_by_side_from_two_threads_equal_eager_steps() -> None:
    steps = [_step(_stack(seed)) for seed in (0, 1)]
    graphs = [StepGraphs(fn, f"stage {i}", True) for i, fn in enumerate(steps)]
    inputs = [torch.randn(ROWS, WIDTH, device="cuda", dtype=torch.bfloat16) for _ in steps]
    with torch.inference_mode():
        for g, x in zip(graphs, inputs, strict=True):  # captured in this thread, as one build does
            g(ROWS, {"x": x})
        expected = [fn(x)[0] for fn, x in zip(steps, inputs, strict=True)]
    torch.cuda.synchronize()
    mismatches = [0, 0]

    def replay(i: int) -> None:
        stream = torch.cuda.Stream()
        with torch.inference_mode(), torch.cuda.stream(stream):
            outs = [graphs[i](ROWS, {"x": inputs[i]})[0] for _ in range(300)]
            stream.synchronize()
        mismatches[i] = sum(not torch.allclose(o, expected[i], rtol=1e-2, atol=1e-2) for o in outs)

    threads = [threading.Thread(target=replay, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert mismatches == [0, 0]
