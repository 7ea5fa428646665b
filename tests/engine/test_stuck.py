"""A stage worker that stops making progress: its requests fail, a process is killed and restarted, a
thread ends the server; the log holds every thread's stack."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from pathlib import Path

import pytest

from omnivoice.engine.engine import RESTARTING, Engine
from omnivoice.engine.stuck import ProgressWatch, stage_lines, thread_stacks
from omnivoice.runners.talker import TalkerRunner
from omnivoice.types import Finished, StageStats
from tests.support.engine import collect, profile_for, request, streaming, tokens_of
from tests.support.polling import until
from tests.support.process_stderr import StderrTail


def test_a_worker_is_stuck_once_silent_for_the_limit_and_never_with_zero() -> None:
    watch = ProgressWatch(10.0)
    watch.reset([("thinker", 0), ("talker", 0)], now=100.0)
    watch.seen("thinker", 0, 105.0)
    watch.seen("code2wav", 0, 105.0)  # not watched (another pipeline's late report)
    assert watch.stuck(109.0) == []
    assert watch.stuck(112.0) == [("talker", 0, 12.0)]
    never = ProgressWatch(0.0)
    never.reset([("talker", 0)], now=0.0)
    assert never.stuck(1e6) == []


def test_the_engine_is_stalled_once_no_request_got_output_for_the_limit() -> None:
    watch = ProgressWatch(10.0)
    watch.reset([("thinker", 0)], now=100.0)
    assert watch.stalled(109.0) is None
    watch.progress(105.0)  # a request got output
    watch.progress(104.0)  # an older report moves nothing back
    assert watch.stalled(114.0) is None
    assert watch.stalled(116.0) == 11.0
    never = ProgressWatch(0.0)
    never.reset([], now=0.0)
    assert never.stalled(1e6) is None


def test_stage_lines_say_what_each_worker_holds() -> None:
    stats = [StageStats("talker", 3, 64, 64, 1200, replica=1, kv_slots_used=64, gave_way_s=2.5)]
    assert stage_lines(stats) == (
        "talker replica 1: 64 running, 3 queued, 1200 steps, last batch 64, 64 KV slots used, 0 routes, "
        "gave way 2.5 s"
    )


def test_thread_stacks_name_each_thread_and_where_it_is() -> None:
    parked = threading.Event()
    t = threading.Thread(target=parked.wait, name="parked-here", daemon=True)
    t.start()
    try:
        text = thread_stacks()
        assert "thread parked-here" in text and "in wait" in text
    finally:
        parked.set()


def _stuck_profile(checkpoint: Path, worker: str):
    data = profile_for(checkpoint, worker=worker).model_dump()
    data["stages"]["stuck_after_s"] = 3.0
    return type(profile_for(checkpoint)).model_validate(data)


async def test_a_frozen_stage_process_is_killed_and_the_stages_restart(tiny_checkpoint: Path, caplog) -> None:
    eng = await Engine.start(_stuck_profile(tiny_checkpoint, "process"))
    try:
        pids = [pid for p in eng._pipeline.processes if (pid := p.pid) is not None]
        stderr = StderrTail(pids)
        eng._pipeline.dump_stacks()  # what a stall asks of every stage process: its stacks on stderr

        def stacks_printed() -> bool:  # each process prints them when its signal handler runs
            err = stderr.text()
            return err.count("Current thread") + err.count("Thread 0x") >= len(pids) and "stage.py" in err

        await until(stacks_printed, 30, what="every stage process's stacks on its stderr")
        task, outs = await streaming(eng, request(eng, 0, thinker_tokens=200, audio_frames=400))
        talker = next(p for p in eng._pipeline.processes if "-talker-" in p.name)
        with caplog.at_level(logging.ERROR, logger="omnivoice.engine.dispatch"):
            os.kill(talker.pid, signal.SIGSTOP)  # alive, but never steps or reports again
            await asyncio.wait_for(task, 30)
        assert isinstance(outs[-1], Finished) and outs[-1].finish_reason == "error"
        assert outs[-1].error == RESTARTING
        assert any("the talker stage made no progress" in r.message for r in caplog.records)
        assert any("thread engine-dispatch" in r.message for r in caplog.records)  # the stacks
        await until(lambda: eng.failure is None, 90, what="the stages restarted")
        outs, fin = await collect(eng, request(eng, 2, thinker_tokens=4, audio_frames=10))
        assert fin.finish_reason == "length" and len(tokens_of(outs)) == 4
    finally:
        await eng.close()


async def test_a_stuck_stage_thread_fails_its_requests_and_ends_the_server(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = await Engine.start(_stuck_profile(tiny_checkpoint, "thread"))
    exits: list[str] = []
    eng.on_device_fault = exits.append  # instead of ending the test's process
    release = threading.Event()
    real_step = TalkerRunner.step

    def hang_once(self, *a, **kw):  # a GPU kernel that never ends cannot be caused on a CPU
        release.wait(60)
        return real_step(self, *a, **kw)

    monkeypatch.setattr(TalkerRunner, "step", hang_once)
    try:
        _, fin = await asyncio.wait_for(collect(eng, request(eng, 0)), 30)
        assert fin.finish_reason == "error" and fin.error is not None
        assert fin.error.startswith("the talker stage made no progress for ")
        await until(lambda: exits == [fin.error], 5, what="the server told to exit")
        with pytest.raises(RuntimeError, match="made no progress"):
            await collect(eng, request(eng, 1))
    finally:
        release.set()
        await eng.close()


async def test_a_stage_that_steps_without_progress_stalls_the_engine_and_ends_the_server(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    eng = await Engine.start(_stuck_profile(tiny_checkpoint, "thread"))
    exits: list[str] = []
    eng.on_device_fault = exits.append  # instead of ending the test's process
    # the talker keeps stepping and reporting, but no step moves any request: a livelock
    monkeypatch.setattr(TalkerRunner, "step", lambda self, defer_ahead=False: [])
    try:
        with caplog.at_level(logging.ERROR, logger="omnivoice.engine.dispatch"):
            outs, fin = await asyncio.wait_for(collect(eng, request(eng, 0, thinker_tokens=4)), 30)
        assert len(tokens_of(outs)) == 4  # the thinker's text came; then nothing
        assert fin.finish_reason == "error" and fin.error is not None
        assert fin.error.startswith("no request made progress for ")
        await until(lambda: exits == [fin.error], 5, what="the server told to exit")
        log = "\n".join(r.message for r in caplog.records)
        assert "talker replica 0: 0 running, 1 queued" in log and "thread stage-talker-0" in log
    finally:
        await eng.close()
