"""Graphs left for after the start: captured narrowest first, from padding inputs, whether the stage
was idle or a step needed one first; a key whose capture fails runs eagerly from then on."""

from __future__ import annotations

import pytest
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


class FailingGraphs(CpuGraphs):
    """Graphs whose capture of the keys in `fail` raises, after its warm-up run, as a capture that
    finds no memory for its graph or a library's workspace does (a fault the CPU cannot cause)."""

    def __init__(self, fn: CountingStep, name: str, fail: set[int]) -> None:
        super().__init__(fn, name)
        self.fail = fail
        self.tries: list[int] = []

    def _capture(self, key, inputs, static):  # type: ignore[no-untyped-def]
        self.tries.append(key)
        if key in self.fail:
            self.fn(**inputs, **static)  # the warm-up run went through
            raise RuntimeError("FIND was unable to find an engine to execute this computation")
        return super()._capture(key, inputs, static)


def _backlog(
    step: CountingStep, widths: tuple[int, ...], fail: set[int] | None = None
) -> tuple[GraphBacklog, CpuGraphs]:
    graphs = CpuGraphs(step, "test decode") if fail is None else FailingGraphs(step, "test decode", fail)
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


def test_a_graph_whose_idle_capture_failed_runs_eagerly_and_is_not_tried_again() -> None:
    step = CountingStep()
    backlog, graphs = _backlog(step, (2, 4), fail={2})
    with pytest.raises(RuntimeError, match="FIND"):
        backlog.capture_next()  # the stage logs it
    assert graphs.eager == {2} and len(backlog) == 1
    for _ in range(3):
        (out,) = graphs(2, {"x": torch.tensor([1.0, 5.0]), "slot": torch.tensor([3, 4])})
        assert out.tolist() == [2.0, 10.0]
    assert step.runs[3:5].tolist() == [3, 3]  # once a call: eagerly
    assert backlog.capture_next() and not backlog.capture_next()  # the other is captured
    assert isinstance(graphs, FailingGraphs) and graphs.tries == [2, 4]


def test_a_step_whose_graph_left_for_later_fails_to_capture_runs_on_eagerly() -> None:
    step = CountingStep()
    backlog, graphs = _backlog(step, (4,), fail={4})
    x, slots = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([3, 4, 5, 6])
    (out,) = graphs(4, {"x": x, "slot": slots})
    assert out.tolist() == [2.0, 4.0, 6.0, 8.0]
    assert step.runs[3:7].tolist() == [1, 1, 1, 1]  # the failed capture ran padding rows only
    graphs(4, {"x": x, "slot": slots})
    assert step.runs[3:7].tolist() == [2, 2, 2, 2] and graphs.eager == {4}
    assert len(backlog) == 0 and not backlog.capture_next()
    assert isinstance(graphs, FailingGraphs) and graphs.tries == [4]


def test_a_failed_capture_from_the_steps_own_inputs_fails_that_step_only() -> None:
    step = CountingStep()
    graphs = FailingGraphs(step, "test decode", fail={2})
    with pytest.raises(RuntimeError, match="FIND"):
        graphs(2, {"x": torch.ones(2), "slot": torch.tensor([3, 4])})  # its rows were stepped once
    (out,) = graphs(2, {"x": torch.ones(2), "slot": torch.tensor([3, 4])})
    assert out.tolist() == [2.0, 2.0] and graphs.tries == [2] and graphs.eager == {2}


class ShortOfMemoryGraphs(CpuGraphs):
    """Graphs whose first `short` recordings find no memory for their graph pool, as a capture does
    while the allocator holds the memory it needs cached (a fault the CPU cannot cause)."""

    def __init__(self, fn: CountingStep, short: int, cached: bool = True) -> None:
        super().__init__(fn, "test decode")
        self.short, self.cached = short, cached
        self.released = 0

    def _record(self, buffers, static):  # type: ignore[no-untyped-def]
        if self.short:
            self.short -= 1
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 84.00 MiB")
        return super()._record(buffers, static)

    def _release_cache(self, device: torch.device) -> bool:
        self.released += self.cached
        return self.cached


def test_a_capture_short_of_memory_releases_the_cache_and_records_once_more() -> None:
    runs = []
    for short in (0, 1):
        step = CountingStep()
        graphs = ShortOfMemoryGraphs(step, short=short)
        (out,) = graphs(2, {"x": torch.tensor([1.0, 3.0]), "slot": torch.tensor([3, 4])})
        assert out.tolist() == [2.0, 6.0] and graphs.released == short
        assert 2 in graphs.captured and not graphs.eager
        runs.append(step.runs[3:5].tolist())
    assert runs[1] == runs[0]  # recording again did not step the rows again


@pytest.mark.parametrize(("short", "cached"), [(2, True), (1, False)])
def test_a_capture_still_short_of_memory_fails_its_step_and_leaves_the_key_eager(
    short: int, cached: bool
) -> None:
    graphs = ShortOfMemoryGraphs(CountingStep(), short=short, cached=cached)
    with pytest.raises(torch.OutOfMemoryError):
        graphs(2, {"x": torch.ones(2), "slot": torch.tensor([3, 4])})
    assert graphs.eager == {2} and graphs.released == int(cached)
    (out,) = graphs(2, {"x": torch.ones(2), "slot": torch.tensor([3, 4])})
    assert out.tolist() == [2.0, 2.0]
