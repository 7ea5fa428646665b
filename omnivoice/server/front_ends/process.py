"""One front-end process of a server with `server.front_ends` > 1 (supervisor.py): the whole app
(transports, sessions, VAD, codecs, chat) on the supervisor's listening socket, with an engine client
of the shared core (engine/core/linked.py) and the figures it counts against with the other front
ends (shared.py).

It ignores SIGINT and SIGTERM (a Ctrl-C or a service manager's stop reaches the whole process group):
the supervisor passes on each signal it gets as a `Stop`, on which the front end drains as a lone
server does on the signal. It ends as soon as the supervisor has ended.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from omnivoice.config import Profile
from omnivoice.engine.stage_process import die_with_parent
from omnivoice.logs import configure_logging, stacks_on_sigusr1
from omnivoice.server.auth.keys import ApiKeys
from omnivoice.server.tally import SharedTally

if TYPE_CHECKING:
    from omnivoice.models.dummy_source import DummySource

log = logging.getLogger(__name__)

ADMISSION = ("in_flight", "streams", "sessions")


@dataclass(frozen=True)
class FrontEndSpec:
    profile: Profile
    index: int
    count: int
    host: str
    log_level: str
    keys: ApiKeys
    source: Path | DummySource
    supervisor: int  # its pid


def shared_names(profile: Profile, keys: ApiKeys) -> list[str]:
    """The figures the front ends share: admission's, and each key's sessions and request bucket."""
    from omnivoice.server.auth.limits import owner_figures

    return [*ADMISSION, *(name for owner in keys.owners() for name in owner_figures(owner))]


def front_end_main(
    spec: FrontEndSpec, listener: socket.socket, channel: socket.socket, tally: SharedTally
) -> None:
    """Entry point of a front-end process (multiprocessing spawn target)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    die_with_parent(spec.supervisor)
    configure_logging(spec.log_level)
    stacks_on_sigusr1()
    from omnivoice.server.app import run_server
    from omnivoice.server.fleet.member import FleetMember

    member = FleetMember(spec.index, spec.count, channel, spec.source, tally)
    code = 1
    try:
        code = asyncio.run(
            run_server(
                spec.profile, spec.host, 0, spec.log_level, member.engine,
                api_keys=spec.keys, insecure_no_auth=True, listener=listener, fleet=member,
            )
        )  # fmt: skip
    except Exception:
        log.exception("front end %d failed", spec.index)
    finally:
        member.close()
        logging.shutdown()
    sys.exit(code)
