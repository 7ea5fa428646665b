"""A one-way connector from one process to another over a pipe of its own, written by the sending thread
itself and read without blocking: what the engine core sends the engine client (engine/core/outbox.py).

A multiprocessing queue hands each item to a feeder thread, which pickles it again and writes it, and
large arrays go through a shared-memory segment each; every one of those steps is a thread that must
take its process's GIL back after a system call, and under load each such wait can last a switch
interval. Here `put_many` pickles the messages with their arrays in the stream (protocol 5, one copy)
and writes them as one frame (its length, then its bytes), at once, from the calling thread. The
reading end is non-blocking: `read_available` takes whatever has arrived and hands out the messages of
every whole frame, so an event loop can read the pipe itself when it is readable (`fileno`), with no
thread between, and never waits on a writer that stopped mid-frame; `get` waits for a thread that
reads instead. The pipe's buffer is enlarged (PIPE_BYTES, where the system allows) so that a frame of
audio outputs is written whole while the reader is busy; a writer whose reader stops reading for
longer blocks once the buffer is full, as backpressure.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from typing import Any

from omnivoice.engine.connectors.frames import FrameReader, encode, write_all

PIPE_BYTES = 1 << 20
_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Linux; elsewhere the call fails and is skipped


class PipeConnector:
    """Made in the reading process and handed to the writing one (its `Connection`s travel with it
    under every start method); one reader, writers in one process."""

    def __init__(self, ctx: Any, pipe_bytes: int = PIPE_BYTES) -> None:
        self._reader, self._writer = ctx.Pipe(duplex=False)
        with contextlib.suppress(OSError):  # the system's limit (or no such call): its default size
            fcntl.fcntl(self._reader.fileno(), _SETPIPE_SZ, pipe_bytes)
        os.set_blocking(self._reader.fileno(), False)
        self._lock = threading.Lock()  # the writers' (threads of the writing process)
        self._frames = FrameReader()  # the reader's

    def __getstate__(self) -> dict[str, Any]:
        """What the writing process gets: the writing end (the reading end stays here)."""
        return {"_writer": self._writer}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reader = None
        self._lock = threading.Lock()
        self._frames = FrameReader()

    @property
    def ended(self) -> bool:
        """The reader saw the writing end close."""
        return self._frames.ended

    def put(self, msg: Any) -> None:
        self.put_many([msg])

    def put_many(self, msgs: list[Any]) -> None:
        """Write `msgs` as one frame; blocks only while the pipe's buffer is full."""
        if msgs:
            header, data = encode(msgs)
            fd = self._writer.fileno()
            with self._lock:
                write_all(fd, header)
                write_all(fd, data)

    def fileno(self) -> int:
        """The reading end, for an event loop to watch (`loop.add_reader`)."""
        assert self._reader is not None, "the writing process has no reading end"
        return int(self._reader.fileno())

    def read_available(self) -> list[Any]:
        """Every message not handed out yet of the frames that have arrived whole, without waiting;
        sets `ended` once the writing end has closed."""
        return self._frames.read_available(self.fileno())

    def get(self, timeout: float | None) -> Any | None:
        """The next message, waiting up to `timeout` for one (a thread's way to read); None if none
        came, or the writing end has closed (then after `timeout`: the caller polls the process)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pending = self._frames.pending
        while not pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if self.ended:
                if left:
                    time.sleep(left)
                return None
            assert self._reader is not None, "the writing process has no reading end"
            if self._reader.poll(left):  # poll(2): no select() limit on the descriptor's number
                pending.extend(self.read_available())
            elif left is not None:
                return None  # nothing came in time (or only part of a frame)
        return pending.popleft()

    def drain(self) -> list[Any]:
        return self.read_available()

    def close_writing_end(self) -> None:
        """In the reading process, once the writer has its own copy: the reader then sees the pipe end
        when the writing process does."""
        self._writer.close()

    def flush(self) -> None:
        """Nothing to wait for: each frame was written whole when it was put."""

    def close(self) -> None:
        for end in (self._reader, self._writer):
            if end is not None:
                with contextlib.suppress(OSError):
                    end.close()
