"""A device fault in a stage stops that stage at once, fails its requests with the device's message, and
(for a stage in the server's own process) ends the process for its supervisor instead of an abort.

A CPU cannot fault like a GPU, so the runner's step is made to raise what torch raises on one."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from omnivoice.engine.connectors import LocalConnector
from omnivoice.engine.device_fault import OUT_OF_MEMORY, failure_text
from omnivoice.engine.engine import Engine
from omnivoice.engine.stage import StageCrashed, StageWorker
from omnivoice.messages import Shutdown, StageFinished
from omnivoice.runners.device_errors import is_device_fault
from omnivoice.runners.talker import TalkerRunner
from omnivoice.types import AudioChunk, Finished
from tests.engine.test_stage_tables import HoldingRunner, request
from tests.support.engine import profile_for
from tests.support.engine import request as engine_request
from tests.support.polling import until, wait_until

FAULT = "CUDA error: an illegal instruction was encountered"


def test_device_faults_are_told_from_request_errors() -> None:
    assert is_device_fault(RuntimeError(FAULT))
    assert is_device_fault(torch.AcceleratorError("CUDA error: an illegal memory access was encountered"))
    assert is_device_fault(RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED when calling cublasGemmEx"))
    assert not is_device_fault(RuntimeError("the prompt leaves no room for audio"))
    assert not is_device_fault(ValueError(FAULT))  # what a request's bad input raises is not the device


@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has ..."),
        torch.AcceleratorError(
            "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"
        ),
        RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
    ],
)
def test_a_failed_allocation_is_out_of_memory_not_a_device_fault(error: Exception) -> None:
    """An allocation that failed leaves the device context usable: the step's requests are told to
    retry (without the allocator's figures, which are the operator's), and the stage goes on."""
    assert not is_device_fault(error)
    assert failure_text(error) == f"{OUT_OF_MEMORY}; retry shortly (the server's log has the details)"


class FaultingRunner(HoldingRunner):
    def __init__(self) -> None:
        super().__init__()
        self.steps = 0

    def has_work(self) -> bool:
        return bool(self.held)

    def step(self, defer_ahead: bool = False) -> list[Any]:
        self.steps += 1
        raise RuntimeError(FAULT)


def test_a_faulted_stage_fails_its_requests_and_stops_stepping() -> None:
    runner = FaultingRunner()
    inbox, talker, engine = LocalConnector(), LocalConnector(), LocalConnector()
    thread = threading.Thread(target=StageWorker(runner, inbox, [talker], engine).run, daemon=True)
    thread.start()
    inbox.put(request("a"))
    thread.join(5)
    try:
        assert not thread.is_alive()  # the worker ended on its own: no Shutdown was sent
        assert runner.steps == 1  # never stepped the faulted device again
        msgs = []
        while (msg := engine.get(timeout=0.1)) is not None:
            msgs.append(msg)
        failed = [m for m in msgs if isinstance(m, StageFinished)]
        assert [(m.request_id, m.reason) for m in failed] == [("a", "error")]
        assert failed[0].error is not None and FAULT in failed[0].error and not failed[0].out_of_memory
        crashed = [m for m in msgs if isinstance(m, StageCrashed)]
        assert len(crashed) == 1 and crashed[0].device_fault and FAULT in crashed[0].error
    finally:
        inbox.put(Shutdown())


async def test_a_fault_in_a_thread_stage_fails_requests_and_ends_the_server(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = await Engine.start(profile_for(tiny_checkpoint))
    exits: list[str] = []
    eng.on_device_fault = exits.append  # instead of ending the test's process
    try:
        real_step = TalkerRunner.step
        faulted = threading.Event()

        def step(self: TalkerRunner, defer_ahead: bool = False) -> list[Any]:
            if faulted.is_set():
                raise RuntimeError(FAULT)
            return real_step(self, defer_ahead)

        monkeypatch.setattr(TalkerRunner, "step", step)
        outs: list[Any] = []

        async def consume() -> None:
            async for out in eng.generate(engine_request(eng, 0, thinker_tokens=100, audio_frames=300)):
                outs.append(out)

        task = asyncio.create_task(consume())
        await until(lambda: any(isinstance(o, AudioChunk) for o in outs), what="the first audio")
        faulted.set()
        await asyncio.wait_for(task, 30)
        assert isinstance(outs[-1], Finished) and outs[-1].finish_reason == "error"
        assert outs[-1].error is not None and FAULT in outs[-1].error  # the device's own words
        wait_until(lambda: bool(exits), 5, what="the exit for the supervisor")
        assert eng.failure is not None and FAULT in eng.failure and not eng.restarting
        with pytest.raises(RuntimeError, match="GPU faulted"):
            async for _ in eng.generate(engine_request(eng, 1)):
                pass
    finally:
        await eng.close()


class OutOfMemoryRunner(FaultingRunner):
    def step(self, defer_ahead: bool = False) -> list[Any]:
        self.steps += 1
        raise torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 94.00 MiB. GPU 0 has a total capacity of 79.18 GiB "
            "of which 82.19 MiB is free. Process 5136 has 66.00 MiB memory in use."
        )


def test_a_step_out_of_memory_fails_its_requests_without_the_gpus_figures_and_steps_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="omnivoice.engine.stage")
    runner = OutOfMemoryRunner()
    inbox, talker, engine = LocalConnector(), LocalConnector(), LocalConnector()
    thread = threading.Thread(target=StageWorker(runner, inbox, [talker], engine).run, daemon=True)
    thread.start()
    failed: list[StageFinished] = []

    def collect() -> list[StageFinished]:
        while (msg := engine.get(timeout=0.05)) is not None:
            if isinstance(msg, StageFinished):
                failed.append(msg)
        return failed

    try:
        inbox.put(request("a"))
        wait_until(collect, what="the request's failure")
        assert [(m.request_id, m.reason) for m in failed] == [("a", "error")]
        error = failed[0].error or ""
        assert "out of GPU memory" in error and "Process 5136" not in error and "GiB" not in error
        assert failed[0].out_of_memory  # what a start-up burst narrows on
        inbox.put(request("b"))  # not a device fault: the stage goes on stepping
        wait_until(lambda: len(collect()) == 2, what="the second request's failure")
        assert [m.request_id for m in failed] == ["a", "b"] and runner.steps == 2 and thread.is_alive()
        # the log has the allocator's figures, as a warning: not a bug's traceback
        said = [r for r in caplog.records if "ran out of GPU memory" in r.getMessage()]
        assert [r.levelno for r in said] == [logging.WARNING] * 2
        assert "82.19 MiB is free" in said[0].getMessage() and not said[0].exc_info
    finally:
        inbox.put(Shutdown())
        thread.join(5)
