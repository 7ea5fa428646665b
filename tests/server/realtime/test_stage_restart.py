"""A stage process that dies ends the stages, not the calls: over a real WebSocket (the tiny model, stage
processes) the response in flight fails with an `error` event and `response.done` failed, the session
stays connected, `/health` says the engine is restarting, and once the stages are back the session's
next turn is answered. A device fault or a stuck stage in a process ends up here too: the process
ends (or is killed) and is found dead like this one."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from omnivoice.engine.dispatch import RESTARTING
from tests.support.polling import until
from tests.support.realtime_client import Recorder, client
from tests.support.serve import ServerThread, serve_tiny
from tests.support.speech import fixed

pytestmark = pytest.mark.slow

ITEM = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Tell me more."}]}


@pytest.fixture(scope="module")
def server(tiny_checkpoint: Path) -> Iterator[ServerThread]:
    with serve_tiny(tiny_checkpoint, worker="process") as st:
        yield st


def _step_sizes(engine: Any) -> dict[str, set[int]]:
    """The batch sizes each stage's worker has step times for, as admission sees them."""
    return {w.name: {b for b, _, _ in w.step_times} for w in engine.replica_stats()}


async def _health_until_ok(url: str, timeout: float) -> list[str]:
    """Every distinct `/health` status seen, in order, polling until it is "ok"."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:  # a loaded machine: slow, not down
        while not seen or seen[-1] != "ok":
            assert time.monotonic() < deadline, f"not healthy again within {timeout} s: {seen}"
            status = (await http.get("/health")).json()["status"]
            if not seen or seen[-1] != status:
                seen.append(status)
            await asyncio.sleep(0.05)
    return seen


@pytest.mark.timeout(1500)  # a server with stage processes, started twice on a loaded machine
async def test_a_dead_stage_fails_the_response_keeps_the_session_and_the_next_turn_works(
    server: ServerThread,
) -> None:
    engine: Any = server.server.config.app.state.lifecycle.engine
    async with client(server.base_url).realtime.connect(model="omnivoice") as conn:
        rec = Recorder(conn)
        await rec.next("session.created")
        await conn.session.update(session=fixed(8, 800))  # 64 s of audio: in flight for a while
        await conn.conversation.item.create(item=ITEM)  # type: ignore[arg-type]
        await conn.response.create()
        await rec.next("response.output_audio.delta", timeout=120)
        assert engine._requests  # the engine is still making it
        await until(lambda: all(w.step_times for w in engine.replica_stats()), 60, "every stage's step times")
        sizes_before = _step_sizes(engine)
        talker = next(p for p in engine._pipeline.processes if "-talker-" in p.name)
        os.kill(talker.pid, signal.SIGKILL)
        failed = await rec.next("response.done", timeout=60)
        error = next(e for _, e in rec.events if e.type == "error")
        seen = await _health_until_ok(server.base_url, 900)
        # the restarted workers have stepped nothing yet: admission still knows their predecessors' times
        sizes_after = _step_sizes(engine)
        # the session is still open: its next turn is answered by the restarted stages
        await conn.session.update(session=fixed(4, 10))
        await conn.conversation.item.create(item=ITEM)  # type: ignore[arg-type]
        await conn.response.create()
        done = await rec.next("response.done", timeout=120)
        audio = rec.audio(done.response.id)
        await rec.close()
    for stage, sizes in sizes_before.items():
        assert sizes and sizes <= sizes_after[stage], (stage, sizes, sizes_after[stage])
    assert failed.response.status == "failed", failed.response.status_details
    details = failed.response.status_details
    assert details is not None and details.error is not None and details.error.code == "engine_error"
    # clients are told the engine is restarting; which process died, and how, is for the log
    assert details.error.message == RESTARTING
    assert error.error.code == "engine_error" and error.error.message == RESTARTING
    assert "restarting" in seen, seen
    assert done.response.status == "incomplete", done.response.status_details  # max_output_tokens
    assert len(audio) > 0
