"""Length-prefixed frames of pickled messages on a byte stream (a pipe, a connected socket): how the
engine core and the server's processes talk when a multiprocessing queue's feeder thread and
shared-memory segments would cost more than one write (engine/connectors/pipe.py,
engine/connectors/socket_link.py).

A frame is its length (8 bytes, little-endian), then one pickle (protocol 5, arrays in the stream) of a
list of messages. The writer writes a frame whole from its own thread; the reader takes whatever has
arrived without blocking and hands out the messages of every whole frame (`FrameReader`), so an event
loop can read the stream itself whenever it is readable.
"""

from __future__ import annotations

import os
import pickle
import select
import struct
from collections import deque
from typing import Any

READ_BYTES = 1 << 20  # taken from the stream per read
LENGTH = struct.Struct("<Q")  # a frame's length, in front of its bytes


def encode(msgs: list[Any]) -> tuple[bytes, bytes]:
    """The frame of `msgs`: its length header and its body."""
    data = pickle.dumps(msgs, protocol=5)
    return LENGTH.pack(len(data)), data


def write_all(fd: int, data: bytes) -> None:
    """Write `data` whole to `fd`, waiting while the stream's buffer is full (a non-blocking
    descriptor too: a socket read without blocking is one)."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            poller = select.poll()
            poller.register(fd, select.POLLOUT)
            poller.poll()


class FrameReader:
    """The reading side of a stream of frames on a non-blocking descriptor."""

    def __init__(self) -> None:
        self._buffer = bytearray()  # bytes of a frame not yet whole
        self.pending: deque[Any] = deque()  # messages read, not yet handed out
        self.ended = False  # the writing side closed

    def read_available(self, fd: int) -> list[Any]:
        """Every message not handed out yet of the frames that have arrived whole, without waiting;
        sets `ended` once the writing side has closed (or the connection was reset)."""
        while not self.ended:
            try:
                chunk = os.read(fd, READ_BYTES)
            except BlockingIOError:
                break
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                self.ended = True
            self._buffer += chunk
            if len(chunk) < READ_BYTES:
                break  # the stream is empty for now
        buf, start = self._buffer, 0
        while len(buf) - start >= LENGTH.size:
            (size,) = LENGTH.unpack_from(buf, start)
            end = start + LENGTH.size + size
            if len(buf) < end:
                break
            self.pending.extend(pickle.loads(buf[start + LENGTH.size : end]))
            start = end
        del buf[:start]
        out = list(self.pending)
        self.pending.clear()
        return out
