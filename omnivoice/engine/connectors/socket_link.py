"""A two-way link between two processes over a connected UNIX stream socket, in frames of pickled
messages (engine/connectors/frames.py): what an engine core and each front-end process of the server
talk over (server/fleet/).

Either side writes from any of its threads (one frame at a time, whole) and reads without blocking
(`read_available`, for an event loop watching `fileno`), or waits for the next message (`get`, for a
thread). The socket's buffers are enlarged (LINK_BYTES) so that a frame of audio outputs is written
whole while the reader is busy; a writer whose reader stops reading for longer waits, as
backpressure. A side that ends (its process exits or is killed) is seen as `ended` by the other.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from typing import Any

from omnivoice.engine.connectors.frames import FrameReader, encode, write_all

LINK_BYTES = 1 << 20


class SocketLink:
    def __init__(self, sock: socket.socket) -> None:
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            with contextlib.suppress(OSError):  # the system's limit: its default size
                sock.setsockopt(socket.SOL_SOCKET, opt, LINK_BYTES)
        sock.setblocking(False)
        self.sock = sock
        self._lock = threading.Lock()  # the writers'
        self._frames = FrameReader()

    @classmethod
    def pair(cls) -> tuple[socket.socket, socket.socket]:
        """Two connected sockets, one for each side (wrap each in a SocketLink where it is used)."""
        return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)

    @property
    def ended(self) -> bool:
        """The other side closed (or its process ended)."""
        return self._frames.ended

    def fileno(self) -> int:
        return self.sock.fileno()

    def put(self, msg: Any) -> None:
        self.put_many([msg])

    def put_many(self, msgs: list[Any]) -> None:
        """Write `msgs` as one frame; OSError (BrokenPipeError) once the other side is gone."""
        if msgs:
            header, data = encode(msgs)
            fd = self.fileno()
            with self._lock:
                write_all(fd, header)
                write_all(fd, data)

    def read_available(self) -> list[Any]:
        """The messages of every whole frame that has arrived, without waiting."""
        return self._frames.read_available(self.fileno())

    def drain(self) -> list[Any]:
        return self.read_available()

    def get(self, timeout: float | None) -> Any | None:
        """The next message, waiting up to `timeout` (None: until one comes or the link ends); None if
        none came in time, or the other side has ended."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pending = self._frames.pending
        poller = select.poll()
        poller.register(self.fileno(), select.POLLIN)
        while not pending:
            if self.ended:
                return None
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if poller.poll(None if left is None else left * 1000):
                pending.extend(self.read_available())
            elif left is not None:
                return None
        return pending.popleft()

    def flush(self) -> None:
        """Nothing to wait for: each frame was written whole when it was put."""

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
