"""StepGraphs whose "graphs" recompute on the CPU: what is captured when, and from which inputs,
without CUDA. A capture runs the function once (as a real capture's warm-up run does) and keeps the
inputs it was captured from; a replay runs it again on the captured buffers."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import torch

from omnivoice.runners.graphs import StepFn, StepGraphs, _Captured


class _Replay:
    def __init__(
        self, fn: StepFn, inputs: dict[str, torch.Tensor], outputs: tuple[torch.Tensor, ...], static: dict
    ) -> None:
        self.fn, self.inputs, self.outputs, self.static = fn, inputs, outputs, static

    def replay(self) -> None:
        for out, new in zip(self.outputs, self.fn(**self.inputs, **self.static), strict=True):
            out.copy_(new)


class CpuGraphs(StepGraphs):
    def __init__(self, fn: StepFn, name: str) -> None:
        super().__init__(fn, name, enabled=False)  # no CUDA graph pool on the CPU
        self.enabled = True
        self.captured_from: dict[Hashable, dict[str, torch.Tensor]] = {}
        self.order: list[Hashable] = []  # keys in the order they were captured

    def _capture(self, key: Hashable, inputs: dict[str, torch.Tensor], static: dict[str, int]) -> _Captured:
        self.captured_from[key] = {name: value.clone() for name, value in inputs.items()}
        entry = super()._capture(key, inputs, static)
        self.order.append(key)
        return entry

    def _warm_up(self, buffers: dict[str, torch.Tensor], static: dict[str, int]) -> None:
        pass  # the recording below runs the function once, as a real capture's warm-up run does

    def _record(
        self, buffers: dict[str, torch.Tensor], static: dict[str, int]
    ) -> tuple[Any, tuple[torch.Tensor, ...]]:
        outputs = tuple(self.fn(**buffers, **static))
        return _Replay(self.fn, buffers, outputs, static), outputs
