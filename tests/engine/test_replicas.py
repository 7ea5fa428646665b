"""Stage replicas: requests spread over them, each request sticks to one replica of each stage."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import numpy as np
import yaml

from omnivoice.config import parse_profile
from omnivoice.engine.engine import Engine
from omnivoice.engine.routing import ReplicaRouter
from omnivoice.types import GenerationRequest, Prompt
from tests.support.engine import audio_of, collect, profile_for, request, tokens_of, wait_idle
from tests.support.polling import until

ROOT = Path(__file__).resolve().parents[2]


def _req(rid: str, audio: bool = True, key: str | None = None) -> GenerationRequest:
    return GenerationRequest(rid, Prompt((1, 2)), want_audio=audio, cache_key=key)


def test_router_picks_the_least_loaded_and_keeps_conversations_on_their_thinker() -> None:
    router = ReplicaRouter(2, 2, 3)
    a = _req("a", key="conv")
    route_a = router.assign(a)
    assert route_a == (0, 0, 0)
    route_b = router.assign(_req("b"))
    assert route_b == (1, 1, 1)
    assert router.assign(_req("c", audio=False)) == (0, 0, 0)  # text-only: thinker load only
    assert router.load() == [[2, 1], [1, 1], [1, 1, 0]]
    router.release(GenerationRequest("a", a.prompt, cache_key="conv", route=route_a))
    assert router.load() == [[1, 1], [0, 1], [0, 1, 0]]
    # thinker 0 and 1 are now equally loaded... load thinker 0 further: the conversation still goes there
    router.assign(_req("d", audio=False))
    assert router.assign(_req("e", key="conv"))[0] == 0
    assert router.thinker_of("conv") == 0
    router.forget("conv")
    assert router.thinker_of("conv") is None


def _replicated(checkpoint: Path, worker: str) -> object:
    base = profile_for(checkpoint, worker=worker).model_dump()
    for stage in ("talker", "code2wav"):
        base["stages"][stage]["replicas"] = 2
    return parse_profile(base)


async def test_thread_replicas_spread_requests_and_give_the_same_output(tiny_checkpoint: Path) -> None:
    single = await Engine.start(profile_for(tiny_checkpoint))
    try:
        reqs = [request(single, i) for i in range(4)]
        expected = await asyncio.gather(*(collect(single, r) for r in reqs))
    finally:
        await single.close()
    eng = await Engine.start(_replicated(tiny_checkpoint, "thread"))
    try:
        got = await asyncio.gather(*(collect(eng, r) for r in reqs))
        await wait_idle(eng)
        talker_steps = [s.steps for s in eng.replica_stats() if s.name == "talker"]
        vocoder_steps = [s.steps for s in eng.replica_stats() if s.name == "code2wav"]
        assert eng.replica_load() == [[0], [0, 0], [0, 0]]
    finally:
        await eng.close()
    assert len(talker_steps) == 2 and all(n > 0 for n in talker_steps), talker_steps
    assert len(vocoder_steps) == 2 and all(n > 0 for n in vocoder_steps), vocoder_steps
    for (e_outs, _), (g_outs, g_fin) in zip(expected, got, strict=True):
        assert g_fin.finish_reason == "length"
        assert tokens_of(g_outs) == tokens_of(e_outs)
        np.testing.assert_allclose(audio_of(g_outs), audio_of(e_outs), rtol=0, atol=1e-5)


async def test_cpu_replicas_profile_runs_replicas_and_replaces_a_killed_one(tiny_checkpoint: Path) -> None:
    data = yaml.safe_load((ROOT / "configs" / "cpu-replicas.yaml").read_text())
    data["model"] = {"path": str(tiny_checkpoint)}
    eng = await Engine.start(parse_profile(data, "cpu-replicas.yaml"))
    try:
        assert sum(1 for p in eng._pipeline.processes if "-talker-" in p.name) == 2
        results = await asyncio.gather(*(collect(eng, request(eng, i, audio_frames=30)) for i in range(2)))
        assert all(fin.finish_reason == "length" and audio_of(outs).size for outs, fin in results)
        await wait_idle(eng)
        used = [s.steps > 0 for s in eng.replica_stats() if s.name == "talker"]
        # a killed replica is replaced (with the rest of the stages) and requests succeed again
        victim = next(p for p in eng._pipeline.processes if p.name.endswith("-talker-1"))
        os.kill(victim.pid, signal.SIGKILL)
        await until(lambda: eng.failure is not None, 120, what="the killed replica noticed")
        await until(lambda: eng.failure is None, 120, what="the stages restarted")
        talkers = [p for p in eng._pipeline.processes if "-talker-" in p.name]
        assert len(talkers) == 2 and all(p.is_alive() for p in talkers)
        results = await asyncio.gather(*(collect(eng, request(eng, i, audio_frames=20)) for i in range(2)))
        assert all(fin.finish_reason == "length" for _, fin in results)
    finally:
        await eng.close()
    assert used == [True, True]
