"""A one-way connector from one process to another over a pipe of its own, written by the sending thread
itself: what the engine core sends the engine client (engine/core/outbox.py).

A multiprocessing queue hands each item to a feeder thread, which pickles it again and writes it, and
large arrays go through a shared-memory segment each; every one of those steps is a thread that must
take its process's GIL back after a system call, and under load each such wait can last a switch
interval. Here `put_many` pickles the messages with their arrays in the stream (protocol 5, one copy)
and writes them as one frame, at once, from the calling thread; the reader takes a frame with one poll
and the reads of its length and its bytes. The pipe's buffer is enlarged (PIPE_BYTES, where the system
allows) so that a frame of audio outputs is written whole while the reader is busy; a writer whose
reader stops reading for longer blocks once the buffer is full, as backpressure.
"""

from __future__ import annotations

import contextlib
import fcntl
import pickle
import threading
import time
from typing import Any

PIPE_BYTES = 1 << 20
_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Linux; elsewhere the call fails and is skipped


class PipeConnector:
    """Made in the reading process and handed to the writing one (its `Connection`s travel with it
    under every start method); one reader, writers in one process."""

    def __init__(self, ctx: Any, pipe_bytes: int = PIPE_BYTES) -> None:
        self._reader, self._writer = ctx.Pipe(duplex=False)
        with contextlib.suppress(OSError):  # the system's limit (or no such call): its default size
            fcntl.fcntl(self._reader.fileno(), _SETPIPE_SZ, pipe_bytes)
        self._lock = threading.Lock()  # the writers' (threads of the writing process)
        self._pending: list[Any] = []  # the reader's: the rest of the frame read last, reversed
        self._ended = False  # the reader saw the writing end close

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]  # each process has its own
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def put(self, msg: Any) -> None:
        self.put_many([msg])

    def put_many(self, msgs: list[Any]) -> None:
        """Write `msgs` as one frame; blocks only while the pipe's buffer is full."""
        if msgs:
            data = pickle.dumps(msgs, protocol=5)
            with self._lock:
                self._writer.send_bytes(data)

    def get(self, timeout: float | None) -> Any | None:
        """The next message (the frames are read one at a time; a frame's messages come in order)."""
        if not self._pending:
            self._pending = self._take(timeout)[::-1]
        return self._pending.pop() if self._pending else None

    def drain(self) -> list[Any]:
        out = self._pending[::-1]
        self._pending = []
        while True:
            frame = self._take(0)
            if not frame:
                return out
            out.extend(frame)

    def _take(self, timeout: float | None) -> list[Any]:
        """One frame's messages, waiting up to `timeout` for it; [] if none came or the writer is gone
        (then after `timeout`, as if nothing came: the caller polls the writing process)."""
        if not self._ended:
            try:
                if not self._reader.poll(timeout):
                    return []
                msgs: list[Any] = pickle.loads(self._reader.recv_bytes())
                return msgs
            except EOFError:
                self._ended = True
        if timeout:
            time.sleep(timeout)
        return []

    def close_writing_end(self) -> None:
        """In the reading process, once the writer has its own copy: the reader then sees the pipe end
        when the writing process does."""
        self._writer.close()

    def flush(self) -> None:
        """Nothing to wait for: each frame was written whole when it was put."""

    def close(self) -> None:
        for end in (self._reader, self._writer):
            with contextlib.suppress(OSError):
                end.close()
