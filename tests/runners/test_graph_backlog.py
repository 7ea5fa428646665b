"""Graphs left for after the start: captured narrowest first, from padding inputs, whether the stage
was idle or a step needed one first."""

from __future__ import annotations

import torch

from omnivoice.runners.graph_backlog import GraphBacklog
from omnivoice.runners.graphs import StepGraphs
from tests.support.cpu_graphs import CpuGraphs

SCRATCH = 0  # the slot padding rows name


class CountingStep:
    """A step with per-slot state, as a decode step's KV positions or a sampler's counts are: each run
    counts one step for every row's slot."""

    def __init__(self) -> None:
        self.runs = torch.zeros(8, dtype=torch.long)

    def __call__(self, x: torch.Tensor, slot: torch.Tensor) -> tuple[torch.Tensor]:
        self.runs.index_add_(0, slot, torch.ones_like(slot))
        return (2 * x,)


def _padding(graphs: CpuGraphs, rows: int):
    def capture() -> object:
        return graphs(rows, {"x": torch.zeros(rows), "slot": torch.full((rows,), SCRATCH)})

    return capture


def _backlog(step: CountingStep, widths: tuple[int, ...]) -> tuple[GraphBacklog, CpuGraphs]:
    graphs = CpuGraphs(step, "test decode")
    backlog = GraphBacklog("test")
    for rows in widths:
        backlog.add(graphs, rows, _padding(graphs, rows))
    return backlog, graphs


def test_idle_captures_go_narrowest_first_until_none_is_left() -> None:
    backlog, graphs = _backlog(CountingStep(), (2, 4, 8))
    assert len(backlog) == 3 and backlog.captured() == 0
    assert backlog.capture_next()
    assert graphs.order == [2] and len(backlog) == 2 and backlog.captured() == 1
    assert backlog.capture_next() and backlog.capture_next()
    assert graphs.order == [2, 4, 8] and len(backlog) == 0
    assert not backlog.capture_next()
    assert (backlog.deferred, backlog.idle) == (3, 3)


def test_a_step_that_needs_a_graph_left_for_later_captures_it_from_padding() -> None:
    step = CountingStep()
    backlog, graphs = _backlog(step, (2, 4))
    x, slots = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([3, 4, 5, 6])
    (out,) = graphs(4, {"x": x, "slot": slots})
    assert out.tolist() == [2.0, 4.0, 6.0, 8.0]  # the step's own rows, replayed
    assert graphs.captured_from[4]["slot"].tolist() == [SCRATCH] * 4  # captured from padding rows
    assert step.runs[3:7].tolist() == [1, 1, 1, 1]  # each real slot stepped once, not twice
    assert len(backlog) == 1 and backlog.captured() == 1
    assert backlog.capture_next()  # the idle capture skips what the step took, takes the rest
    assert graphs.order == [4, 2] and not backlog.capture_next()
    assert (backlog.deferred, backlog.idle) == (2, 1)


def test_a_graph_never_left_for_later_is_captured_from_the_steps_inputs() -> None:
    """Without deferral a first use captures from the step's own rows: the double step `defer` avoids."""
    step = CountingStep()
    graphs = CpuGraphs(step, "test decode")
    graphs(2, {"x": torch.ones(2), "slot": torch.tensor([3, 4])})
    assert step.runs[3:5].tolist() == [2, 2]


def test_nothing_is_left_when_graphs_are_off() -> None:
    graphs = StepGraphs(CountingStep(), "eager", enabled=False)
    backlog = GraphBacklog("test")
    backlog.add(graphs, 4, lambda: None)
    assert len(backlog) == 0 and not backlog.capture_next() and backlog.deferred == 0
