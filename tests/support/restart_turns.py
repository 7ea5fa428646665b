"""A realtime turn cut by an engine fault, and the session's next turn: the shared path of the tests
that kill a stage process or the engine core under a live session (tests/server/realtime/
test_stage_restart.py, tests/server/test_engine_core.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from omnivoice.engine.dispatch import RESTARTING

from .realtime_client import Recorder
from .speech import fixed

ITEM = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Tell me more."}]}


async def health_until_ok(url: str, timeout: float) -> list[str]:
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


@dataclass
class Interrupted:
    failed: Any  # the cut response's response.done
    error: Any  # the error event before it
    health: list[str]  # /health's statuses until it said "ok" again


async def interrupted_turn(
    conn: Any, rec: Recorder, base_url: str, fault: Callable[[], Awaitable[None]]
) -> Interrupted:
    """Start a long response, and once its audio flows run `fault` (which kills a process); then wait
    for the response's end and for `/health` to be ok again."""
    await rec.next("session.created")
    await conn.session.update(session=fixed(8, 800))  # 64 s of audio: in flight for a while
    await conn.conversation.item.create(item=ITEM)
    await conn.response.create()
    await rec.next("response.output_audio.delta", timeout=120)
    await fault()
    failed = await rec.next("response.done", timeout=60)
    error = next(e for _, e in rec.events if e.type == "error")
    return Interrupted(failed, error, await health_until_ok(base_url, 900))


async def next_turn(conn: Any, rec: Recorder) -> tuple[Any, bytes]:
    """The session's next turn, short: its response.done and its audio."""
    await conn.session.update(session=fixed(4, 10))
    await conn.conversation.item.create(item=ITEM)
    await conn.response.create()
    done = await rec.next("response.done", timeout=120)
    return done, rec.audio(done.response.id)


def check_failed_then_answered(cut: Interrupted, done: Any, audio: bytes) -> None:
    """The cut response failed with the engine's error (the client told it restarts; which process
    died, and how, is for the log), /health said so, and the next turn was answered."""
    assert cut.failed.response.status == "failed", cut.failed.response.status_details
    details = cut.failed.response.status_details
    assert details is not None and details.error is not None and details.error.code == "engine_error"
    assert details.error.message == RESTARTING
    assert cut.error.error.code == "engine_error" and cut.error.error.message == RESTARTING
    assert "restarting" in cut.health, cut.health
    assert done.response.status == "incomplete", done.response.status_details  # max_output_tokens
    assert len(audio) > 0
