"""Messages with descriptors: a UNIX sequenced-packet socket on which each message is one packet (one
pickle), and may carry open file descriptors with it (SCM_RIGHTS). What the server's supervisor
(server/fleet/) uses to talk to its front-end processes and to hand them, and the engine core, the
ends of the links it makes between them at run time.

Packets keep their boundaries, so a message and its descriptors arrive together and whole, or not at
all; `recv_available` reads without blocking (for an event loop watching `fileno`), `recv` waits (for
a thread). A message is at most the socket's buffer (PACKET_BYTES, enlarged where the system allows).
"""

from __future__ import annotations

import array
import contextlib
import pickle
import select
import socket
import threading
from typing import Any

PACKET_BYTES = 4 << 20
MAX_FDS = 8


class PacketLink:
    def __init__(self, sock: socket.socket) -> None:
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, opt, PACKET_BYTES)
        self.sock = sock
        self._lock = threading.Lock()
        self.ended = False  # the other side closed

    @staticmethod
    def pair() -> tuple[socket.socket, socket.socket]:
        return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, msg: Any, fds: tuple[int, ...] = ()) -> None:
        """Send `msg` (and duplicates of `fds`) as one packet; OSError once the other side is gone."""
        data = pickle.dumps(msg, protocol=5)
        with self._lock:
            if fds:
                socket.send_fds(self.sock, [data], list(fds))
            else:
                self.sock.sendall(data)

    def recv(self, timeout: float | None = None) -> tuple[Any, list[int]] | None:
        """The next message and the descriptors it carried, waiting up to `timeout` (None: until one
        comes); None if none came in time, or the other side is gone (`ended`)."""
        poller = select.poll()
        poller.register(self.fileno(), select.POLLIN)
        if not poller.poll(None if timeout is None else timeout * 1000):
            return None
        got = self._recv_one(block=True)
        return got

    def recv_available(self) -> list[tuple[Any, list[int]]]:
        """Every message that has arrived, without waiting."""
        out: list[tuple[Any, list[int]]] = []
        while not self.ended:
            got = self._recv_one(block=False)
            if got is None:
                break
            out.append(got)
        return out

    def _recv_one(self, block: bool) -> tuple[Any, list[int]] | None:
        fds = array.array("i")
        flags = 0 if block else socket.MSG_DONTWAIT
        try:
            data, ancdata, _, _ = self.sock.recvmsg(
                PACKET_BYTES, socket.CMSG_SPACE(MAX_FDS * fds.itemsize), flags
            )
        except (BlockingIOError, InterruptedError):
            return None
        except (ConnectionResetError, OSError):
            data, ancdata = b"", []
        for level, kind, cdata in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(cdata[: len(cdata) - (len(cdata) % fds.itemsize)])
        if not data:
            self.ended = True
            return None
        return pickle.loads(data), list(fds)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
