"""The life of a stage worker in a process of its own: it starts with the server's connectors, stops
when the server says so, and never outlives the server.

- Stop signals are the server's business. SIGINT and SIGTERM are ignored here: a Ctrl-C in a terminal
  or systemd's stop reaches the whole process group, and a worker that died of it mid-drain would cut
  the responses the server is letting finish. The server stops its workers with a Shutdown message
  (and kills those that do not stop).
- A worker dies with its server, however the server ends (kill -9 included): a thread waits on the
  pipe that `multiprocessing` keeps open from the server (`parent_process().sentinel`), which the
  kernel closes when the server's process ends, and ends this process at once, unlinking the dead
  server's shared-memory segments. The server is named by the pid it passes (`parent`), never by
  this process's parent, which is the forkserver when the stages are forked from one
  (engine/parent_watch.py). (Linux's PR_SET_PDEATHSIG is no substitute: it fires when the *thread*
  that started the worker ends, and the supervisor starts workers from a thread that ends right
  after.) `StageWorker` also polls whether the server runs, a fallback where the pipe is missing.
- The worker takes the server's environment (`environ`) before anything else: a process forked from
  the forkserver would otherwise have the forkserver's (engine/process_start.py).
- The process ends with `os._exit` once what it sent the server is flushed and its log written: the
  interpreter's own teardown has nothing left to do, and it would report every object frozen out of
  the GC (`gc_policy`) that a C++ extension still counts as alive (Triton's nanobind bindings print a
  "leaked" report of their objects, types and functions at every worker's exit). Only
  multiprocessing's exit finalizers run before it: they unlink the named semaphores of the queues
  this process made (the engine core makes its stages' inboxes), which the server's resource tracker
  would otherwise report as leaked at its shutdown.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from multiprocessing.connection import wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omnivoice.config import Profile
from omnivoice.engine.board import Seat
from omnivoice.engine.gc_policy import freeze_built_objects
from omnivoice.engine.parent_watch import server_alive, server_sentinel
from omnivoice.engine.process_stats import shm_prefix, unlink_segments
from omnivoice.engine.stage import StageCrashed, StageWorker
from omnivoice.logs import configure_logging, stacks_on_sigusr1
from omnivoice.types import StageName

if TYPE_CHECKING:
    from omnivoice.models.dummy import DummySource

log = logging.getLogger(__name__)

EXIT_PARENT_GONE = 3


def stage_process_main(
    name: StageName,
    replica: int,
    profile: Profile,
    model_path: Path | DummySource,
    inbox: Any,
    downstream: list[Any],
    engine: Any,
    parent: int,
    seat: Seat | None = None,
    environ: dict[str, str] | None = None,
) -> None:
    """Entry point of a stage process (`multiprocessing` target, spawned or forked from the forkserver);
    never returns. `parent`: the server's pid; `seat`: its place on the pipeline's priority board
    (engine/board.py); `environ`: the server's environment, taken in place of this process's own."""
    if environ is not None:
        take_environment(environ)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    die_with_parent(parent)
    configure_logging(profile.server.log_level)
    stacks_on_sigusr1()  # the engine asks for its stacks when no request makes progress
    _thread_lock_for_progress_bars()
    code = 0
    try:
        code = _serve(name, replica, profile, model_path, inbox, downstream, engine, parent, seat)
    except BaseException:
        log.exception("%s stage (replica %d) failed", name, replica)
        code = 1
    finally:
        exit_process(code, engine, parent)


def _serve(
    name: StageName,
    replica: int,
    profile: Profile,
    model_path: Path | DummySource,
    inbox: Any,
    downstream: list[Any],
    engine: Any,
    parent: int,
    seat: Seat | None,
) -> int:
    from omnivoice.runners.factory import build_runners

    try:
        only = ((name, replica),)
        runner = build_runners(profile, model_path, only=only, report=engine.put)[(name, replica)]
    except Exception as e:  # report, so the engine fails fast instead of waiting
        log.exception("%s stage (replica %d) failed to start", name, replica)
        engine.put(StageCrashed(name, repr(e)))
        return 1
    freeze_built_objects(f"{name} stage (replica {replica})")
    priority = profile.stages.priority
    StageWorker(runner, inbox, downstream, engine, parent, replica, seat, priority).run()
    return 0


def take_environment(environ: dict[str, str]) -> None:
    """Make `environ` (the server's) this process's environment, in place of the one it started with
    (a forked process's is the forkserver's: engine/process_start.py)."""
    os.environ.clear()
    os.environ.update(environ)


def _thread_lock_for_progress_bars() -> None:
    """Loading progress bars (tqdm's, which transformers draws) guard their writes with a lock that is
    a multiprocessing semaphore by default. This process ends with `os._exit`, which never unlinks it,
    so the server's resource tracker would find one leaked semaphore per stage process at shutdown and
    warn about it. The bars of one process need a thread lock only."""
    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())


def die_with_parent(parent: int) -> None:
    """End this process as soon as the process that started it (pid `parent`) has ended."""
    sentinel = server_sentinel(parent)
    if sentinel is None:  # not started by multiprocessing from `parent`: the poll only
        return

    def watch() -> None:
        # readable (EOF) once the server's end of the pipe is closed: the server holds it as long as
        # it holds this process's handle, which it drops only after this process has ended
        wait([sentinel])
        unlink_segments(shm_prefix(parent))  # no one reads the messages in flight any more
        log.warning("the process that started this one (pid %d) is gone; this one ends with it", parent)
        os._exit(EXIT_PARENT_GONE)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def exit_process(code: int, engine: Any, parent: int) -> None:
    """Flush what this process sent the server (if it is still there) and its log, then end without
    the interpreter's teardown (see the module docstring)."""
    if server_alive(parent):
        try:
            engine.flush()  # a StageCrashed put just now must reach the server
        except Exception:
            log.exception("could not flush the engine queue")
    release_semaphores()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed, or its reader is gone
            stream.flush()
    os._exit(code)


def release_semaphores() -> None:
    """Run multiprocessing's exit finalizers, as a normal exit would: among them, unlinking the names of
    the semaphores this process made (a queue's locks) and telling the resource tracker so. Those of
    lower priority (joining queues' feeder threads, which could wait on a reader that is gone) do not
    run. A handle another process holds stays valid: only the name goes."""
    from multiprocessing import util

    try:
        util._run_finalizers(0)  # type: ignore[attr-defined]
    except Exception:
        log.exception("multiprocessing's exit finalizers failed")
