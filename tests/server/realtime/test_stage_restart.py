"""A stage process that dies ends the stages, not the calls: over a real WebSocket (the tiny model, stage
processes) the response in flight fails with an `error` event and `response.done` failed, the session
stays connected, `/health` says the engine is restarting, and once the stages are back the session's
next turn is answered. A device fault or a stuck stage in a process ends up here too: the process
ends (or is killed) and is found dead like this one."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.polling import until
from tests.support.realtime_client import Recorder, client
from tests.support.restart_turns import check_failed_then_answered, interrupted_turn, next_turn
from tests.support.serve import ServerThread, serve_tiny

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tiny_checkpoint: Path) -> Iterator[ServerThread]:
    with serve_tiny(tiny_checkpoint, worker="process") as st:
        yield st


def _step_sizes(engine: Any) -> dict[str, set[int]]:
    """The batch sizes each stage's worker has step times for, as admission sees them."""
    return {w.name: {b for b, _, _ in w.step_times} for w in engine.replica_stats()}


@pytest.mark.timeout(1500)  # a server with stage processes, started twice on a loaded machine
async def test_a_dead_stage_fails_the_response_keeps_the_session_and_the_next_turn_works(
    server: ServerThread,
) -> None:
    engine: Any = server.server.config.app.state.lifecycle.engine
    sizes_before: dict[str, set[int]] = {}

    async def kill_the_talker() -> None:
        assert engine._requests  # the engine is still making it
        await until(lambda: all(w.step_times for w in engine.replica_stats()), 60, "every stage's step times")
        sizes_before.update(_step_sizes(engine))
        talker = next(p for p in engine._pipeline.processes if "-talker-" in p.name)
        os.kill(talker.pid, signal.SIGKILL)

    async with client(server.base_url).realtime.connect(model="omnivoice") as conn:
        rec = Recorder(conn)
        cut = await interrupted_turn(conn, rec, server.base_url, kill_the_talker)
        # the restarted workers have stepped nothing yet: admission still knows their predecessors' times
        sizes_after = _step_sizes(engine)
        # the session is still open: its next turn is answered by the restarted stages
        done, audio = await next_turn(conn, rec)
        await rec.close()
    for stage, sizes in sizes_before.items():
        assert sizes and sizes <= sizes_after[stage], (stage, sizes, sizes_after[stage])
    check_failed_then_answered(cut, done, audio)
