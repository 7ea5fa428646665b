"""Ray connector: stage messages through a `ray.util.queue.Queue` (an actor), so the workers that read
and write it may run on any node of a Ray cluster.

Each `put` waits for the queue actor to take the message: Ray does not order calls to an async actor
that are still in flight, and stages need their chunks in order. Messages cross as pickle (protocol 5)
bytes with their arrays as separate buffers, like the shared-memory connector's: the queue actor never
imports the message classes, and arrays come out writable (Ray's own zero-copy arrays are read-only).
The connector pickles as its queue's actor handle, so it can be passed to the stage actors.
Only imported when a profile has a `worker: ray` stage.
"""

from __future__ import annotations

import pickle
from typing import Any

import ray
from ray.exceptions import RayActorError
from ray.util.queue import Empty, Queue


class RayQueueConnector:
    def __init__(self, name: str | None = None, namespace: str | None = None) -> None:
        # num_cpus=0: the queue actor only moves messages, it must not take a stage's CPU
        options: dict[str, Any] = {"num_cpus": 0}
        if name is not None:
            options.update(name=name, namespace=namespace)
        self._q = Queue(actor_options=options)
        self._closed = False

    def put(self, msg: Any) -> None:
        self._call(self._q.put, _encode(msg))

    def put_many(self, msgs: list[Any]) -> None:
        """`msgs` in order, in one call to the queue actor (waited for, as `put`)."""
        if msgs:
            self._call(self._q.put_nowait_batch, [_encode(m) for m in msgs])

    def get(self, timeout: float | None) -> Any | None:
        try:
            item = self._call(self._q.get, True, timeout)
        except Empty:
            return None
        return _decode(item)

    def drain(self) -> list[Any]:
        n = self._call(self._q.qsize)
        return [_decode(item) for item in self._call(self._q.get_nowait_batch, n)] if n else []

    def close(self) -> None:
        # the queue's actor, and with it every message still in it; a reader waiting on it gets EOFError
        if not self._closed and ray.is_initialized():
            ray.kill(self._q.actor, no_restart=True)  # type: ignore[arg-type]  # ray types it loosely
        self._closed = True

    def _call(self, fn: Any, *args: Any) -> Any:
        # never after close or ray.shutdown(): a call then would quietly start a new local Ray instance
        if self._closed or not ray.is_initialized():
            raise EOFError("ray connector is closed")
        try:
            return fn(*args)
        except RayActorError as e:  # its actor was killed (closed) or its node is gone
            raise EOFError("ray connector is closed") from e


def _encode(msg: Any) -> tuple[bytes, list[bytes]]:
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(msg, protocol=5, buffer_callback=buffers.append)
    return data, [bytes(b.raw()) for b in buffers]


def _decode(item: tuple[bytes, list[bytes]]) -> Any:
    data, buffers = item
    return pickle.loads(data, buffers=[bytearray(b) for b in buffers])
