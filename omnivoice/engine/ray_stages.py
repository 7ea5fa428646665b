"""Stage replicas as Ray actors (`worker: ray`), placed on a Ray cluster by the profile.

Each replica is one actor that builds its runner and runs the ordinary StageWorker loop; messages
move through RayQueueConnectors. An actor asks Ray for the CPUs of its stage's `threads` and, on a
CUDA device, for a GPU: replicas whose profile devices name the same GPU share one (1/n each), so
Ray puts them on one GPU of one node. Ray chooses the GPU and exposes it to the actor as cuda:0.

`ray.address: null` starts a private local cluster, shut down when the pipeline stops; an address
("auto", "host:6379", "ray://host:10001") attaches to a running cluster, which is left running. A
restart keeps the connection: Ray is not shut down and started again in a serving process. Only
imported when a profile has a `worker: ray` stage.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
from ray.exceptions import GetTimeoutError

from omnivoice.config import Profile
from omnivoice.engine.connectors import Connector
from omnivoice.engine.connectors.rayqueue import RayQueueConnector
from omnivoice.engine.gc_policy import freeze_built_objects
from omnivoice.engine.stage import StageCrashed, StageWorker
from omnivoice.logs import configure_logging
from omnivoice.types import STAGES, StageName

if TYPE_CHECKING:
    from omnivoice.models.dummy import DummySource

log = logging.getLogger(__name__)
# Ray's own default is 15: on a busy node anything else (the server itself) then takes the stage
# actors' CPU first, and an actor's start or step waits behind all of it
WORKER_NICENESS = 0  # the private cluster's workers (`ray.init(_system_config=...)`)


class StageActor:
    """One replica of one stage, in a Ray worker process (wrapped by `ray.remote` at start)."""

    def __init__(
        self,
        name: StageName,
        replica: int,
        profile: Profile,
        model_path: Path | DummySource,
        inbox: Connector,
        downstream: list[Connector],
        engine: Connector,
    ) -> None:
        self.name, self.replica = name, replica
        self.profile, self.model_path = profile, model_path
        self.inbox, self.downstream, self.engine = inbox, downstream, engine

    def run(self) -> None:
        """Build the runner and serve until Shutdown; a build error is reported, not raised."""
        from omnivoice.runners.factory import build_runners

        configure_logging(self.profile.server.log_level)
        if (nice := os.nice(0)) > 0:  # a cluster started without RAY_worker_niceness=0 (Ray's own is 15)
            log.warning(
                "%s stage (replica %d) runs at niceness %d: any other load on its node starves it; "
                "start the Ray cluster with RAY_worker_niceness=0",
                self.name,
                self.replica,
                nice,
            )
        profile = _on_assigned_gpu(self.profile, self.name, self.replica)
        try:
            runner = build_runners(profile, self.model_path, only=((self.name, self.replica),))
        except Exception as e:
            log.exception("%s stage (replica %d) failed to start", self.name, self.replica)
            self.engine.put(StageCrashed(self.name, repr(e)))
            return
        freeze_built_objects(f"{self.name} stage (replica {self.replica})")
        # no parent pid: Ray ends an actor whose driver is gone; no shared board: an actor may run on
        # another node, so it orders its own work only
        worker = StageWorker(
            runner[(self.name, self.replica)],
            self.inbox,
            self.downstream,
            self.engine,
            replica=self.replica,
            priority=profile.stages.priority,
        )
        worker.run()


def actor_resources(profile: Profile, stage: StageName, replica: int) -> dict[str, float]:
    """What the replica's actor asks Ray for: its stage's threads as CPUs, a GPU share on CUDA."""
    cfg = profile.stages.stage(stage)
    device = _gpu_key(cfg.replica_device(replica))
    if device is None:
        return {"num_cpus": cfg.threads, "num_gpus": 0}
    gpus = Counter(_gpu_key(profile.stages.stage(s).replica_device(r)) for s, r in ray_workers(profile))
    return {"num_cpus": cfg.threads, "num_gpus": 1 / gpus[device]}


def ray_workers(profile: Profile) -> list[tuple[StageName, int]]:
    stages = STAGES
    cfg = profile.stages.stage
    return [(s, r) for s in stages if cfg(s).worker == "ray" for r in range(cfg(s).replicas)]


def _gpu_key(device: str) -> str | None:
    if not device.startswith("cuda"):
        return None
    return device if ":" in device else "cuda:0"


def _on_assigned_gpu(profile: Profile, stage: StageName, replica: int) -> Profile:
    """The profile as seen inside the actor: Ray shows it only its own GPU, as cuda:0."""
    cfg = profile.stages.stage(stage)
    if _gpu_key(cfg.replica_device(replica)) is None:
        return profile
    local = cfg.model_copy(update={"device": "cuda:0", "devices": None})
    return profile.model_copy(update={"stages": profile.stages.model_copy(update={stage: local})})


class RayStages:
    """The Ray side of a pipeline: the cluster connection, the stage actors, their liveness. A restarted
    pipeline takes over its predecessor's (Pipeline.start(..., ray=old.ray))."""

    def __init__(self, profile: Profile) -> None:
        self._profile = profile
        self._tag = uuid.uuid4().hex[:8]  # actor names unique per pipeline, readable in `ray list actors`
        self._actors: list[tuple[str, Any, Any]] = []  # (name, actor handle, ref of its run())
        self._queues = 0
        self.started_cluster = False
        self._connected = False  # whether this pipeline called ray.init (and so must disconnect)
        cfg = profile.ray
        if ray.is_initialized():
            log.info("using the Ray connection this process already has")
            return
        if cfg.address is None:
            needed = sum(actor_resources(profile, s, r)["num_cpus"] for s, r in ray_workers(profile))
            # a private cluster on this node: as many CPUs as the actors ask for, even on a small machine
            ray.init(
                address="local",
                namespace=cfg.namespace,
                num_cpus=max(os.cpu_count() or 1, int(needed)),
                include_dashboard=False,
                _system_config={"worker_niceness": WORKER_NICENESS},
            )
            self.started_cluster = True
            log.info("started a local Ray cluster")
        else:
            ray.init(address=cfg.address, namespace=cfg.namespace)
            log.info("attached to the Ray cluster at %s", cfg.address)
        self._connected = True

    def connector(self) -> RayQueueConnector:
        _check_connected()
        self._queues += 1
        return RayQueueConnector(f"omnivoice-{self._tag}-queue-{self._queues}", self._profile.ray.namespace)

    def start(
        self,
        stage: StageName,
        replica: int,
        model_path: Path | DummySource,
        inbox: Connector,
        downstream: list[Connector],
        engine: Connector,
    ) -> None:
        _check_connected()
        name = f"omnivoice-{self._tag}-{stage}-{replica}"
        actor_class = ray.remote(StageActor).options(
            name=name,
            namespace=self._profile.ray.namespace,
            max_restarts=0,  # a dead replica is reported by dead(); the engine decides what follows
            **actor_resources(self._profile, stage, replica),
        )
        actor: Any = actor_class.remote(stage, replica, self._profile, model_path, inbox, downstream, engine)
        self._actors.append((name, actor, actor.run.remote()))

    def dead(self) -> list[str]:
        """Actors whose run() has ended: returned (a stage stops only at shutdown) or died."""
        refs = [ref for _, _, ref in self._actors]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0) if refs else ([], [])
        ended = {ref.hex() for ref in done}
        out = []
        for name, _, ref in self._actors:
            if ref.hex() in ended:
                out.append(f"{name} ({_how_it_ended(ref)})")
        return out

    def kill(self, stage: str, replica: int) -> bool:
        """Kill the actor of a stage replica (dead() then lists it); False when there is none."""
        for name, actor, _ in self._actors:
            if name.endswith(f"-{stage}-{replica}"):
                ray.kill(actor, no_restart=True)
                return True
        return False

    def stop(self, timeout: float) -> None:
        """Wait up to `timeout` s for the actors to leave their loops (Shutdown was sent), then kill them."""
        refs = [ref for _, _, ref in self._actors]
        if refs:
            _, running = ray.wait(refs, num_returns=len(refs), timeout=timeout)
            if running:
                log.warning("%d stage actors did not stop in %.0f s; killing them", len(running), timeout)
        for _, actor, _ in self._actors:
            ray.kill(actor, no_restart=True)
        self._actors.clear()
        self._tag = uuid.uuid4().hex[:8]  # a restart's actors must not wait for these names to free

    def shutdown(self) -> None:
        """Disconnect if this pipeline connected (stopping the local cluster it started, if any)."""
        if self._connected:
            ray.shutdown()
            self._connected = False


def _check_connected() -> None:
    # Ray would otherwise quietly start a new local instance for the call
    if not ray.is_initialized():
        raise RuntimeError("the Ray connection of these stages was shut down")


def _how_it_ended(ref: Any) -> str:
    try:
        ray.get(ref, timeout=0)
    except GetTimeoutError:
        return "running"
    except Exception as e:  # the actor died, or run() raised: Ray's error says which
        return type(e).__name__
    return "returned"
