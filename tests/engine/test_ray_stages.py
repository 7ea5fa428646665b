"""Stages as Ray actors on a local Ray cluster: same output as thread workers, replicas used, and
nothing left on the cluster after close."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from omnivoice.config import ProfileError, parse_profile
from omnivoice.engine.engine import RESTARTING, Engine
from tests.support.engine import audio_of, collect, request, tokens_of, wait_idle
from tests.support.polling import until, wait_until

ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install 'omnivoice[ray]'")

from omnivoice.engine.ray_stages import (  # noqa: E402
    WORKER_NICENESS,
    RayStages,
    _on_assigned_gpu,
    actor_resources,
)

ROOT = Path(__file__).resolve().parents[2]


def _cpu_ray(checkpoint: Path, worker: str = "ray", replicas: int = 2) -> dict:
    data = yaml.safe_load((ROOT / "configs" / "cpu-ray.yaml").read_text())
    data["model"] = {"path": str(checkpoint)}
    for stage in ("thinker", "talker", "code2wav"):
        data["stages"][stage]["worker"] = worker
    for stage in ("talker", "code2wav"):
        data["stages"][stage]["replicas"] = replicas
    # chunks keep their sizes: where they end must not depend on the machine's speed
    data["stages"]["code2wav"].setdefault("chunk", {})["catch_up"] = False
    return data


def test_the_single_node_path_does_not_import_ray() -> None:
    code = (
        "import sys, omnivoice.cli, omnivoice.server.app, omnivoice.engine.engine, omnivoice.engine.pipeline;"
        "assert not [m for m in sys.modules if m == 'ray' or m.startswith('ray.')]"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_placement_asks_ray_for_cpus_and_gpu_shares() -> None:
    profile = parse_profile(
        {
            "stages": {
                "thinker": {"worker": "ray", "device": "cuda:0", "threads": 4},
                "talker": {"worker": "ray", "replicas": 2, "devices": ["cuda:1", "cuda:2"]},
                "code2wav": {"worker": "ray", "replicas": 2, "devices": ["cuda:1", "cuda:2"]},
            }
        }
    )
    assert actor_resources(profile, "thinker", 0) == {"num_cpus": 4, "num_gpus": 1.0}
    # talker#1 and code2wav#1 both name cuda:2: half a GPU each, so Ray packs them on one GPU
    assert actor_resources(profile, "talker", 1) == {"num_cpus": 1, "num_gpus": 0.5}
    assert actor_resources(parse_profile({}), "talker", 0) == {"num_cpus": 1, "num_gpus": 0}
    inside = _on_assigned_gpu(profile, "talker", 1)  # Ray shows the actor its GPU as cuda:0
    assert inside.stages.talker.replica_device(1) == "cuda:0"
    assert inside.stages.thinker.device == "cuda:0" and inside.stages.code2wav.devices == ("cuda:1", "cuda:2")


def test_profile_rejects_process_stages_beside_ray_stages() -> None:
    with pytest.raises(ProfileError, match=r"stages\.thinker\.worker: process cannot be mixed with ray"):
        parse_profile({"stages": {"talker": {"worker": "ray"}}})


def test_private_cluster_and_its_queues_come_and_go() -> None:
    assert not ray.is_initialized()
    stages = RayStages(
        parse_profile({"stages": {s: {"worker": "ray"} for s in ("thinker", "talker", "code2wav")}})
    )
    try:
        assert stages.started_cluster and ray.is_initialized()
        q = stages.connector()
        for i in range(3):
            q.put({"i": i, "pcm": np.full(70_000, i, np.float32)})
        first = q.get(timeout=5)
        rest = q.drain()
        assert [m["i"] for m in [first, *rest]] == [0, 1, 2]  # in order
        assert first is not None
        first["pcm"][0] = 1.0  # writable, like the shared-memory connector's arrays
        assert q.get(timeout=0.05) is None and q.drain() == []
        q.close()
        with pytest.raises(EOFError):
            q.get(timeout=1)
        late = stages.connector()
    finally:
        stages.shutdown()
    with pytest.raises(EOFError):  # a late reader after shutdown, and no new Ray instance for it
        late.get(timeout=0.2)
    assert not ray.is_initialized()


@pytest.fixture
def ray_cluster():
    # workers at niceness 0, as the engine's own private cluster starts them: at Ray's default (15)
    # the other tests running beside this one starve the stage actors for minutes
    ray.init(
        num_cpus=6,
        include_dashboard=False,
        namespace="omnivoice-tests",
        _system_config={"worker_niceness": WORKER_NICENESS},
    )
    yield
    ray.shutdown()


@pytest.mark.timeout(900)  # a Ray cluster and two starts of the stages: minutes on a busy 2-core machine
async def test_ray_actors_match_thread_workers_come_back_and_leave_nothing(
    tiny_checkpoint: Path, ray_cluster, caplog: pytest.LogCaptureFixture
) -> None:
    single = await Engine.start(parse_profile(_cpu_ray(tiny_checkpoint, "thread", replicas=1)))
    try:
        reqs = [request(single, i) for i in range(2)]
        expected = await asyncio.gather(*(collect(single, r) for r in reqs))
    finally:
        await single.close()
    eng = await Engine.start(parse_profile(_cpu_ray(tiny_checkpoint), "cpu-ray.yaml"))
    try:
        assert not eng._pipeline.ray.started_cluster  # it joined the test's cluster
        actors = ray.util.list_named_actors(all_namespaces=True)
        assert sum("-talker-" in a["name"] for a in actors) == 2
        assert (
            _stage_actor_niceness() == [WORKER_NICENESS] * 5
        )  # not starved by whatever else runs on the node
        got = await asyncio.gather(*(collect(eng, r) for r in reqs))
        await wait_idle(eng)
        steps = {(s.name, s.replica): s.steps for s in eng.replica_stats()}
        assert eng._pipeline.dead_workers() == []
        # a replica's actor that dies is noticed like a dead stage process, and the stages come back
        # on the same Ray connection
        (victim,) = [a for a in actors if a["name"].endswith("-talker-1")]
        ray.kill(ray.get_actor(victim["name"], namespace=victim["namespace"]))
        with caplog.at_level(logging.ERROR, logger="omnivoice.engine.dispatch"):
            await until(lambda: eng.failure, 10, what="the dead actor noticed")
        # clients are told the engine is restarting; which actor died, and how, goes to the log
        assert eng.failure == RESTARTING
        assert f"{victim['name']} (ActorDiedError)" in caplog.text, caplog.text
        # a bound for a busy machine: Ray restarts its actors' processes, each importing torch again
        await until(lambda: not (eng.failure or eng.restarting), 300, what="the stages restarted")
        again, fin = await collect(eng, reqs[1])
        assert fin.finish_reason == "length" and tokens_of(again) == tokens_of(expected[1][0])
        assert victim["name"] not in {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)}
    finally:
        await eng.close()
    assert all(steps[(s, r)] > 0 for s in ("talker", "code2wav") for r in (0, 1)), steps
    for (e_outs, _), (g_outs, g_fin) in zip(expected, got, strict=True):
        assert g_fin.finish_reason == "length"
        assert tokens_of(g_outs) == tokens_of(e_outs)
        np.testing.assert_allclose(audio_of(g_outs), audio_of(e_outs), rtol=0, atol=1e-5)
    # no stage actor or queue is left, and every CPU the actors held is free again (kills are async)
    wait_until(_cluster_is_empty, 10, what="every stage actor gone and its CPUs free")


def _cluster_is_empty() -> bool:
    free, total = ray.available_resources().get("CPU"), ray.cluster_resources()["CPU"]
    return not ray.util.list_named_actors(all_namespaces=True) and free == total


def _stage_actor_niceness() -> list[int]:
    """The niceness of every stage actor's process on this node (Ray names them `ray::StageActor...`)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "cmdline").read_bytes().startswith(b"ray::StageActor"):
                found.append(os.getpriority(os.PRIO_PROCESS, int(proc.name)))
        except OSError:  # a process that ended meanwhile
            continue
    return found
