"""A real `omnivoice serve` killed with SIGKILL: its stage processes end with it, even mid-request, and
the next start takes back what a dead server left (a stage process that could not end, shared-memory
segments) and says so in its log. The forkserver the stage processes were forked from (the default
start method) ends once the server and they are gone."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

import httpx
import pytest

from omnivoice.engine.process_stats import SHM_DIR, shm_prefix, start_time
from tests.support.polling import until
from tests.support.requests import streamed_audio_chat
from tests.support.serve_process import ServeProcess, forkservers, running, stage_processes, write_profile

LONG_CHAT = streamed_audio_chat(900)  # 72 s of audio: every stage still busy when the server dies


@pytest.mark.timeout(600)
async def test_a_killed_server_takes_its_stages_along_and_the_next_start_reclaims_leftovers(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    env = {"OMNIVOICE_RUN_DIR": str(tmp_path / "run")}
    first = ServeProcess(write_profile(tmp_path, tiny_checkpoint, worker="process"), env=env)
    workers: dict[int, int] = {}
    forkserver: dict[int, int] = {}
    leftover = SHM_DIR / f"{shm_prefix(first.proc.pid)}leftover"
    try:
        url = await asyncio.to_thread(first.wait_ready, 240)
        pid = first.proc.pid
        workers = stage_processes(pid)
        assert len(workers) == 3, workers
        forkserver = forkservers(pid)
        assert len(forkserver) == 1, forkserver
        async with (
            httpx.AsyncClient(base_url=url, timeout=60) as c,
            c.stream("POST", "/v1/chat/completions", json=LONG_CHAT) as stream,
        ):
            lines = stream.aiter_lines()
            assert (await anext(lines)).startswith("data: ")
            # one stage process cannot act on its server's death (stopped here, as one stuck in a
            # driver call would be): only the next start can end it. The last started is code2wav's,
            # so the talker before it goes on computing frames when the server dies.
            stuck = list(workers)[-1]
            others = {p: t for p, t in workers.items() if p != stuck}
            os.kill(stuck, signal.SIGSTOP)
            os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(httpx.HTTPError):
                async for _ in lines:
                    pass
        await asyncio.to_thread(first.proc.wait, 30)
        await until(lambda: not running(others), 10, what="the stage processes ending with their server")
        assert running({stuck: workers[stuck]})
        # the segment of a message that was in flight when everything died
        leftover.write_bytes(b"\0" * 4096)

        second = ServeProcess(write_profile(tmp_path, tiny_checkpoint, worker="thread"), env=env)
        try:
            await asyncio.to_thread(second.wait_ready, 240)
            await until(lambda: not running({stuck: workers[stuck]}), 10, what="the next start ending it")
            # the stuck process held the forkserver's "alive" pipe; with it gone, the forkserver ends
            await until(lambda: not running(forkserver), 10, what="the dead server's forkserver ending")
            assert not leftover.exists()
            reclaimed = [line for line in second.lines if "reclaimed" in line]
            assert len(reclaimed) == 1, second.log[-3000:]
            assert f"pid {pid}" in reclaimed[0] and f"(pid {stuck})" in reclaimed[0], reclaimed
            assert "1 stage process" in reclaimed[0] and "1 shared-memory segment" in reclaimed[0]
            assert not list((tmp_path / "run").glob("*.json"))  # the dead server's record is gone
        finally:
            second.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(Exception):
                await asyncio.to_thread(second.proc.wait, 60)
            second.kill()
    finally:
        first.kill()
        for w, started in {**workers, **forkserver}.items():  # what a failed test left (never a reused pid)
            if start_time(w) == started:
                with contextlib.suppress(OSError):
                    os.kill(w, signal.SIGKILL)
        leftover.unlink(missing_ok=True)
