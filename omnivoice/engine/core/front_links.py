"""The engine core's side of its links to the server's front-end processes (`server.front_ends` > 1,
server/fleet/): each front end sends its requests, aborts, encoder windows and forgotten
conversations over a socket link of its own (engine/connectors/socket_link.py), and hears its
requests' outputs, its refusals and the engine's snapshots on the same link, from an outbox of its own
(engine/core/outbox.py). The supervisor hands the core each link's end through the core's door (a
packet socket, engine/core/packets.py) once the core is ready, and again for a front end that
it restarted.

A thread per link reads it and carries each message out as the core's main loop does its own
(engine/core/process.py), under one lock. A request's outputs go to the link it came from. A link
that ends (its front end exited or was killed) has its requests still running cancelled, so a front
end that is gone holds no slot of the stages.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from typing import Any

from omnivoice.engine.connectors.socket_link import SocketLink
from omnivoice.engine.core.outbox import CoreOutbox
from omnivoice.engine.core.packets import PacketLink
from omnivoice.messages import Abort, CloseCore, CoreSnapshot, NewRequest
from omnivoice.types import EngineOutput, Finished

log = logging.getLogger(__name__)

# (message, the outbox its outputs and refusals go to, the sink of its request's outputs)
CarryOut = Callable[[Any, CoreOutbox, Callable[[EngineOutput], None]], None]


class FrontLink:
    """One front end's link, its outbox, and the requests it has running here."""

    def __init__(
        self,
        index: int,
        sock: socket.socket,
        health: Callable[[], tuple[str | None, bool]],
        snapshot: Callable[[], CoreSnapshot],
    ) -> None:
        self.index = index
        self.link = SocketLink(sock)
        self.outbox = CoreOutbox(self.link, health)
        self.outbox.snapshots(snapshot)
        self.running: set[str] = set()  # request ids submitted here whose Finished has not gone

    def output(self, out: EngineOutput) -> None:
        """A request's output (on the dispatcher thread): to this front end."""
        if isinstance(out, Finished):
            self.running.discard(out.request_id)
        self.outbox.output(out)


class FrontLinks:
    """The core's links to its front ends: `start` opens the door, and a thread reads each link that
    comes in; `carry_out` is the core's handling of one message (engine/core/process.py), called under
    `lock`."""

    def __init__(
        self,
        door: socket.socket | None,
        health: Callable[[], tuple[str | None, bool]],
        snapshot: Callable[[], CoreSnapshot],
        carry_out: CarryOut,
        cancel: Callable[[str], None],
        lock: threading.Lock,
    ) -> None:
        self._door = PacketLink(door) if door is not None else None
        self._health = health
        self._snapshot = snapshot
        self._carry_out = carry_out
        self._cancel = cancel
        self._lock = lock
        self.links: dict[int, FrontLink] = {}  # by front end

    def start(self) -> None:
        if self._door is not None:
            threading.Thread(target=self._admit, name="front-door-links", daemon=True).start()

    def close(self) -> None:
        """Send what each outbox holds, then close the links (the readers end with them)."""
        if self._door is not None:
            self._door.close()
        for fl in list(self.links.values()):
            fl.outbox.close()
            fl.link.close()

    def _admit(self) -> None:
        """Take each link the supervisor hands in: (front end index, its end's descriptor)."""
        assert self._door is not None
        while True:
            try:
                got = self._door.recv()
            except (OSError, ValueError):
                return
            if got is None:
                if self._door.ended:
                    return
                continue
            index, fds = got
            if len(fds) != 1 or not isinstance(index, int):
                log.error("engine core: a malformed link came in at the door (%r, %d fds)", index, len(fds))
                continue
            fl = FrontLink(index, socket.socket(fileno=fds[0]), self._health, self._snapshot)
            old = self.links.get(index)
            if old is not None:
                old.link.close()  # that front end was restarted: its old reader ends
            self.links[index] = fl
            log.info("engine core: front end %d linked", index)
            threading.Thread(target=self._read, args=(fl,), name=f"front-link-{index}", daemon=True).start()

    def _read(self, fl: FrontLink) -> None:
        while True:
            try:
                msg = fl.link.get(timeout=None)
            except (OSError, ValueError):  # closed here (the core is stopping)
                return
            if msg is None:  # the front end is gone
                break
            if isinstance(msg, CloseCore):
                continue  # only the server's supervisor closes the core
            with self._lock:
                if isinstance(msg, NewRequest):
                    fl.running.add(msg.request.request_id)
                elif isinstance(msg, Abort) and msg.request_id not in fl.running:
                    continue  # not this front end's request
                self._carry_out(msg, fl.outbox, fl.output)
        left = list(fl.running)
        log.warning("front end %d left the engine core; cancelling its %d requests", fl.index, len(left))
        with self._lock:
            for rid in left:
                self._cancel(rid)
        fl.outbox.close()
