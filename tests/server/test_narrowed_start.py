"""A core process whose warm-up burst runs out of GPU memory still starts, narrowed to the width that
went through, over a real server and the tiny model: `/health` and `/metrics` say so, and while one
response runs a second streaming request is refused with 503 before any stream starts (the engine
client knows the core's width from its snapshots).

A CPU cannot run out of GPU memory: a `sitecustomize` on the core process's path makes the talker's
prefill raise what torch raises on a GPU, for the rows of any warm-up burst wider than one."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import httpx
import pytest

from tests.support.serve import serve_tiny

pytestmark = pytest.mark.slow

SHORT_OF_MEMORY = """
import os

if os.environ.get("OMNIVOICE_TEST_SHORT_OF_MEMORY"):
    import torch

    from omnivoice.runners.talker import TalkerRunner

    _prefill = TalkerRunner._prefill

    def _short_of_memory(self, seqs):
        wide = [s for s in seqs if s.request.request_id.startswith("warm-burst-")]
        if any(not s.request.request_id.startswith("warm-burst-w1-") for s in wide):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB (injected)")
        return _prefill(self, seqs)

    TalkerRunner._prefill = _short_of_memory
"""

USER = [{"role": "user", "content": "Hello there."}]
# long enough to be running still when the second request comes (it is cancelled then)
LONG = {"messages": USER, "stream": True, "max_tokens": 400, "min_tokens": 400, "min_audio_frames": 400}


def test_a_core_short_of_memory_serves_the_width_that_went_through(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "sitecustomize.py").write_text(SHORT_OF_MEMORY)
    path = [str(tmp_path), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(path))
    monkeypatch.setenv("OMNIVOICE_TEST_SHORT_OF_MEMORY", "1")
    stage = {"worker": "thread", "max_seq_len": 1024, "max_batch": 3}
    stages = {
        "core": "process",
        "warm_burst": True,
        "thinker": stage,
        "talker": stage,
        "code2wav": stage,
        "capacity": {"enabled": False},  # the engine's own width is what refuses here
    }
    with serve_tiny(tiny_checkpoint, stages=stages) as st:
        health = httpx.get(f"{st.base_url}/health", timeout=10)
        assert health.status_code == 200 and health.json() == {"status": "ok", "narrowed_to": 1}
        assert "omnivoice_engine_narrowed_requests 1.0" in httpx.get(f"{st.base_url}/metrics").text
        second = asyncio.run(_second_while_one_runs(st.base_url))
    assert second.status_code == 503 and second.headers["retry-after"] == "1"
    error = second.json()["error"]
    assert error["code"] == "server_overloaded"
    assert (
        error["message"]
        == "the server is at capacity: its GPU memory allows 1 request at a time; retry shortly"
    )


async def _second_while_one_runs(url: str) -> httpx.Response:
    """The answer to a second streaming request sent while a first one streams (read as it comes)."""
    started = asyncio.Event()

    async def first(c: httpx.AsyncClient) -> None:
        async with c.stream("POST", "/v1/chat/completions", json=LONG) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    assert "error" not in json.loads(line.removeprefix("data: "))
                    started.set()

    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        running = asyncio.create_task(first(c))
        waiting = asyncio.create_task(started.wait())
        await asyncio.wait({running, waiting}, return_when=asyncio.FIRST_COMPLETED)
        assert started.is_set(), running.result()  # the first ended before it streamed: its error
        try:
            return await c.post("/v1/chat/completions", json={"messages": USER, "stream": True})
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
