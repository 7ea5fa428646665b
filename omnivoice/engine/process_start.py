"""How stage processes are started: spawned, or forked from a forkserver that imported their code once.

A spawned stage process is a fresh interpreter that imports torch, transformers and the runners before
it can load a weight: every stage process of every start and restart pays those imports, all of them
at once on the same cores. With `stages.start_method: forkserver` (the default where the platform has
it) one process, multiprocessing's forkserver, imports them once (engine/forkserver_preload.py) and
each stage process is forked from it, its imports done. `start_forkserver` starts it at the very
beginning of the engine's start: it returns at once, and the forkserver imports in its own process
while the server loads the model's tokenizer and prompt builder; a restart of the stages forks them
from the forkserver already running. One forkserver serves the process that started it for its life.

A forked stage process differs from a spawned one in two things, both made explicit:
- its environment is the forkserver's, the server's when the forkserver started: the server's
  environment as it is when each stage process starts is passed to the process, which takes it
  first (`stage_process_main`'s `environ`). Only what a preloaded module reads while it is imported
  keeps the forkserver's value.
- its parent is the forkserver: the server's pid is passed to it, and it watches the server through
  multiprocessing's pipe from the server (engine/parent_watch.py), not through its parent's pid.
The server hears of a forked process's exit through the forkserver; were the forkserver killed, the
pipeline would count every stage process as ended (engine/pipeline.py kills any that still runs).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import multiprocessing.forkserver
from multiprocessing.context import ForkServerContext, SpawnContext
from typing import Any

from omnivoice.config import StagesConfig
from omnivoice.types import STAGES

log = logging.getLogger(__name__)

PRELOAD = "omnivoice.engine.forkserver_preload"


def uses_processes(stages: StagesConfig) -> bool:
    """Whether any stage runs in a process of its own (`worker: process`)."""
    return any(stages.stage(s).worker == "process" for s in STAGES)


def uses_cuda_processes(stages: StagesConfig) -> bool:
    """Whether any stage process (`worker: process`) runs on a CUDA device."""
    return any(
        stages.stage(s).worker == "process" and stages.stage(s).replica_device(r).startswith("cuda")
        for s in STAGES
        for r in range(stages.stage(s).replicas)
    )


def stage_context(stages: StagesConfig) -> SpawnContext | ForkServerContext:
    """The multiprocessing context the stage processes, and the queues and shared arrays they are
    given, are made from. Forked CUDA stages need a forkserver that made no CUDA call
    (`forkserver_cuda_check`); where it made one, they are spawned, with a warning that says where
    the call came from."""
    if stages.process_start_method() == "spawn":
        return mp.get_context("spawn")
    ctx = _forkserver_context()
    if uses_cuda_processes(stages):
        call_site = forkserver_cuda_check(ctx)
        if call_site is not None:
            log.warning(
                "the stage processes are spawned, not forked: their forkserver made a CUDA call while "
                "it imported their code, so no process forked from it could use CUDA. The call: %s",
                call_site,
            )
            return mp.get_context("spawn")
    return ctx


def _forkserver_context() -> ForkServerContext:
    multiprocessing.forkserver.set_forkserver_preload([PRELOAD])
    return mp.get_context("forkserver")


def forkserver_cuda_check(ctx: ForkServerContext, timeout: float = 300.0) -> str | None:
    """Fork one probe process from the forkserver (waiting for its imports) and return None if the
    processes it forks can use CUDA, else where the forkserver's CUDA call came from."""
    receive, send = ctx.Pipe(duplex=False)
    probe = ctx.Process(target=_report_cuda_fork, args=(send,), name="omnivoice-fork-probe", daemon=True)
    probe.start()
    send.close()
    try:
        if not receive.poll(timeout):
            raise RuntimeError(f"the stage processes' forkserver forked no probe within {timeout:.0f} s")
        unusable, call_site = receive.recv()
    except EOFError:
        raise RuntimeError(f"the forkserver's probe process ended (exit code {probe.exitcode})") from None
    finally:
        receive.close()
        probe.join(30)
    if not unusable:
        return None
    return str(call_site or "(not seen: made before the preload's imports, or from native code)")


def _report_cuda_fork(send: Any) -> None:
    """The probe's target: whether CUDA is unusable in this forked process, and the preload's record of
    the CUDA call that made it so."""
    import torch

    from omnivoice.engine import forkserver_preload

    send.send((bool(torch.cuda._is_in_bad_fork()), forkserver_preload.CUDA_CALL_SITE))
    send.close()


def start_forkserver(stages: StagesConfig) -> None:
    """Start the forkserver now if these stages' processes are forked from one and it is not running
    yet; returns at once (its imports run in its own process). Nothing to do for spawned stages."""
    if not uses_processes(stages) or stages.process_start_method() != "forkserver":
        return
    _forkserver_context()
    try:
        multiprocessing.forkserver.ensure_running()
    except OSError as e:  # the stages' start tries again, and reports what fails
        log.warning("could not start the stage processes' forkserver yet: %s", e)
