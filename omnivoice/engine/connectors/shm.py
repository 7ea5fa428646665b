"""Cross-process connector: pickled control data on a multiprocessing queue, array payloads in
shared memory.

Messages are pickled with protocol 5 so numpy arrays become out-of-band buffers. Payloads above
`inline_limit` bytes are copied into one fresh shared-memory segment per item put; the reader copies
them out and unlinks the segment at once, so a segment lives only while its item is in flight. A
stage step's outputs for one destination go as one item (`put_many`): what a message costs to send
(a pickle, a queue hop through the feeder thread and the pipe, the reader's lock and unpickle) is
then paid once per step, not once per request.
Segments are named after the process that made the connector (`process_stats.shm_prefix`), so the
server can count its own in /dev/shm (a leak check).
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import queue
import secrets
from collections import deque
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory
from typing import Any

from omnivoice.engine.process_stats import shm_prefix


class ShmConnector:
    def __init__(self, ctx: Any | None = None, inline_limit: int = 64 * 1024) -> None:
        ctx = ctx or mp.get_context("spawn")
        self._q = ctx.Queue()
        self._inline_limit = inline_limit
        self._prefix = shm_prefix()  # the creating (server) process's, also in the stage processes
        # the reader's: messages of an item taken off the queue that `get` has not handed out yet
        self._pending: deque[Any] = deque()

    def put(self, msg: Any) -> None:
        self._q.put(self._encode(msg, False))

    def put_many(self, msgs: list[Any]) -> None:
        """Send `msgs`, in order, as one item: one pickle, one segment and one queue hop for all."""
        if msgs:
            self._q.put(self._encode(msgs, True))

    def _encode(self, obj: Any, many: bool) -> tuple[bytes, str | None, list[Any], bool]:
        buffers: list[pickle.PickleBuffer] = []
        data = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
        raws = [b.raw() for b in buffers]
        sizes = [r.nbytes for r in raws]
        total = sum(sizes)
        if total <= self._inline_limit:
            return data, None, [bytes(r) for r in raws], many
        shm = SharedMemory(name=self._prefix + secrets.token_hex(8), create=True, size=total)
        # the reader unlinks it; stop this process's tracker from unlinking it again at exit
        resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
        buf = _buffer(shm)
        offset = 0
        for r in raws:
            buf[offset : offset + r.nbytes] = r
            offset += r.nbytes
        name = shm.name
        shm.close()
        return data, name, sizes, many

    def _decode(self, item: tuple[bytes, str | None, list[Any], bool]) -> list[Any]:
        """The messages of one queue item (several when it was sent by `put_many`)."""
        data, name, payload, many = item
        obj = self._load(data, name, payload)
        return obj if many else [obj]

    def _load(self, data: bytes, name: str | None, payload: list[Any]) -> Any:
        if name is None:
            # bytearray: arrays that come out of the pickle stay writable
            return pickle.loads(data, buffers=[bytearray(b) for b in payload])
        shm = SharedMemory(name=name)
        try:
            blob = bytearray(_buffer(shm)[: sum(payload)])
        finally:
            shm.close()
            shm.unlink()  # also unregisters it from this process's tracker
        views: list[memoryview] = []
        offset = 0
        mv = memoryview(blob)
        for size in payload:
            views.append(mv[offset : offset + size])
            offset += size
        return pickle.loads(data, buffers=views)

    def get(self, timeout: float | None) -> Any | None:
        if not self._pending:
            try:
                item = self._q.get(timeout=timeout)
            except queue.Empty:
                return None
            self._pending.extend(self._decode(item))
        return self._pending.popleft()

    def drain(self) -> list[Any]:
        out = list(self._pending)
        self._pending.clear()
        while True:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                return out
            out.extend(self._decode(item))

    def flush(self) -> None:
        """Wait until what this process put is in the pipe (its feeder thread sends it in the
        background); call once, before the process ends without the interpreter's exit handlers."""
        self._q.close()
        self._q.join_thread()

    def close(self) -> None:
        # drop whatever is still in flight so its segments are unlinked; the queue's feeder thread
        # may still be flushing, so wait briefly for items rather than stopping at the first miss
        while self.get(timeout=0.05) is not None:
            pass
        self._q.close()
        self._q.cancel_join_thread()


def _buffer(shm: SharedMemory) -> memoryview:
    """The segment's bytes (typeshed allows None, which a segment has only once closed)."""
    if shm.buf is None:
        raise RuntimeError(f"shared memory segment {shm.name} is closed")
    return shm.buf
