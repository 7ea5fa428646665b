"""The engine core's process: the in-process engine (pipeline, dispatch, supervisor, capacity), started
and driven over a channel by the engine client in the server (engine/core/client.py).

It starts the engine, reporting each step of the start, says `CoreReady`, then carries out what the
client sends: requests (their outputs go back through the outbox), aborts, the encoder's windows,
forgotten conversations, a hold on restarts, and the close. Like a stage process it ignores SIGINT and
SIGTERM (the server stops it with CloseCore) and ends as soon as the server's process has ended, and
its stage processes end with it. A device fault in a stage thread here ends this process
(engine/device_fault.py), and the client starts a fresh core.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omnivoice.config import Profile
from omnivoice.engine.core.front_links import FrontLinks
from omnivoice.engine.core.outbox import CoreOutbox
from omnivoice.engine.gc_policy import freeze_built_objects
from omnivoice.engine.stage_process import die_with_parent, exit_process
from omnivoice.engine.start_progress import StartProgress
from omnivoice.logs import configure_logging, stacks_on_sigusr1
from omnivoice.messages import (
    Abort,
    CloseCore,
    CoreExpect,
    CoreReady,
    CoreRefused,
    CoreSnapshot,
    CoreStartFailed,
    EncodeAhead,
    ForgetPrefix,
    HoldRestarts,
    NewRequest,
    StartStep,
)
from omnivoice.types import EngineOutput, EngineOverloaded, EngineUnavailable, SecondsHistogram

if TYPE_CHECKING:
    from omnivoice.engine.engine import Engine
    from omnivoice.models.dummy import DummySource

log = logging.getLogger(__name__)


class ForwardedProgress(StartProgress):
    """The core's start steps, kept here (for the start record) and told to the client, whose own
    StartProgress logs them and shows them in /health."""

    def __init__(self, outbox: CoreOutbox) -> None:
        super().__init__(log_steps=False)
        self._outbox = outbox

    def expect(self, times: dict[str, float], total_s: float) -> None:
        super().expect(times, total_s)
        self._outbox.send(CoreExpect(dict(times), total_s))

    def record(self, msg: StartStep) -> None:
        super().record(msg)
        self._outbox.send(msg)


def run_core(
    profile: Profile,
    source: Path | DummySource,
    inbox: Any,
    outbox: Any,
    parent: int,
    door: socket.socket | None = None,
) -> None:
    """The core process's life, after its entry (engine/core/entry.py) started the stages' forkserver;
    never returns. `door`: where its links to the server's front ends come in (engine/core/front_links.py)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    die_with_parent(parent)
    configure_logging(profile.server.log_level)
    stacks_on_sigusr1()
    code = 1
    try:
        code = _serve(profile, source, inbox, outbox, door)
    except BaseException:
        log.exception("the engine core failed")
    finally:
        exit_process(code, outbox, parent)  # as a stage process ends


def _serve(
    profile: Profile, source: Path | DummySource, inbox: Any, channel: Any, door: socket.socket | None
) -> int:
    from omnivoice.engine.engine import Engine

    state: list[Engine] = []

    def health() -> tuple[str | None, bool]:
        return (state[0].failure, state[0].restarting) if state else (None, False)

    outbox = CoreOutbox(channel, health)
    try:
        engine = Engine.start_sync(profile, source, ForwardedProgress(outbox))
    except Exception as e:
        log.exception("the engine core could not start the engine")
        outbox.send(CoreStartFailed(f"{type(e).__name__}: {e}"))
        outbox.close()
        return 1
    state.append(engine)
    freeze_built_objects("engine core")
    requests = SecondsHistogram("request")  # the clients' requests' way here (types.HOPS)
    outbox.snapshots(lambda: _snapshot(engine, requests))
    lock = threading.Lock()  # one message carried out at a time, whichever link it came on

    def carry_out(msg: Any, to: CoreOutbox, sink: Callable[[EngineOutput], None]) -> None:
        if isinstance(msg, NewRequest) and msg.sent_at:
            requests.record(time.monotonic() - msg.sent_at)
        _carry_out(engine, to, msg, sink)

    fronts = FrontLinks(door, health, lambda: _snapshot(engine, requests), carry_out, engine.cancel, lock)
    fronts.start()
    outbox.send(CoreReady(os.getpid()))
    log.info("engine core ready (pid %d)", os.getpid())
    try:
        while True:
            msg = inbox.get(timeout=1.0)
            if msg is None:
                continue
            if isinstance(msg, CloseCore):
                break
            with lock:
                carry_out(msg, outbox, outbox.output)
    finally:
        asyncio.run(engine.close())
        fronts.close()
        outbox.close()
    log.info("engine core closed")
    return 0


def _carry_out(engine: Engine, outbox: CoreOutbox, msg: Any, sink: Callable[[EngineOutput], None]) -> None:
    """One of a client's messages (other than CloseCore): its refusals go to `outbox`, the outputs of
    its request to `sink`."""
    if isinstance(msg, NewRequest):
        rid = msg.request.request_id
        try:
            engine.submit(msg.request, sink)
        except EngineOverloaded as e:
            outbox.send(CoreRefused(rid, "overloaded", str(e)))
        except EngineUnavailable as e:
            outbox.send(CoreRefused(rid, "unavailable", str(e)))
        except ValueError as e:
            outbox.send(CoreRefused(rid, "invalid", str(e)))
        except RuntimeError as e:
            outbox.send(CoreRefused(rid, "closed", str(e)))
    elif isinstance(msg, Abort):
        engine.cancel(msg.request_id)
    elif isinstance(msg, EncodeAhead):
        engine.encode_ahead(msg.cache_key, msg.features)
    elif isinstance(msg, ForgetPrefix):
        engine.forget(msg.cache_key)
    elif isinstance(msg, HoldRestarts):
        engine.hold_restarts()
    else:
        log.error("engine core: unexpected message %s", type(msg).__name__)


def _snapshot(engine: Engine, requests: SecondsHistogram) -> CoreSnapshot:
    return CoreSnapshot(
        engine.stats(), engine.replica_stats(), engine.failure, engine.restarting, requests.copy()
    )
