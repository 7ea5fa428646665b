"""The core's one writer to the engine client: outputs of every request, refusals, start steps and
snapshots, sent in order by one thread, each wake-up's worth as one item on the channel.

The dispatcher thread makes outputs one at a time; what piles up while the sender pickles the last
batch goes together, so a busy core pays one channel hop for many outputs. A snapshot of the engine's
figures goes every SNAPSHOT_S, and with each batch of outputs the engine's failure and restart state
and when the batch's oldest output came and when it was sent (the `outbox` hop of types.HOPS).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from omnivoice.messages import CoreOutputs, CoreSnapshot
from omnivoice.types import EngineOutput

log = logging.getLogger(__name__)

SNAPSHOT_S = 0.1  # how often the client hears the engine's figures (what admission and /health read)


class CoreOutbox:
    def __init__(
        self,
        channel: Any,  # a connector: put_many(list)
        health: Callable[[], tuple[str | None, bool]],
        snapshot: Callable[[], CoreSnapshot] | None = None,
    ) -> None:
        self._channel = channel
        self._health = health
        self._snapshot = snapshot
        self._items: list[Any] = []  # EngineOutput, or another message to send as it is
        self._cond = threading.Condition()
        self._closed = False
        self._gone = False  # the client's end was closed
        self._thread = threading.Thread(target=self._run, name="core-outbox", daemon=True)
        self._thread.start()

    def output(self, out: EngineOutput) -> None:
        """A request's output (a sink of `Engine.submit`)."""
        with self._cond:
            self._items.append(_Output(out, time.monotonic()))
            self._cond.notify()

    def send(self, msg: Any) -> None:
        """Any other message, after what was given before it."""
        with self._cond:
            self._items.append(msg)
            self._cond.notify()

    def snapshots(self, snapshot: Callable[[], CoreSnapshot]) -> None:
        """Send `snapshot()` every SNAPSHOT_S from now on (once the engine is up)."""
        self._snapshot = snapshot
        with self._cond:
            self._cond.notify()

    def close(self, timeout: float = 10.0) -> None:
        """Send what is left, then stop the sender."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        next_snapshot = time.monotonic()
        while True:
            with self._cond:
                while not self._items and not self._closed:
                    wait = next_snapshot - time.monotonic() if self._snapshot is not None else None
                    if wait is not None and wait <= 0:
                        break
                    self._cond.wait(wait)
                items, self._items = self._items, []
                closed = self._closed
            msgs = self._batch(items)
            if self._snapshot is not None and (time.monotonic() >= next_snapshot or closed):
                next_snapshot = time.monotonic() + SNAPSHOT_S
                try:
                    msgs.append(self._snapshot())
                except Exception:
                    log.exception("could not take the engine's snapshot")
            try:
                if not self._gone:
                    self._channel.put_many(msgs)
            except (BrokenPipeError, ConnectionResetError):
                self._gone = True  # the client is gone: whoever reads its end says what follows
                log.info("the engine client left; its last %d messages were not sent", len(msgs))
            except Exception:
                log.exception("could not send %d messages to the engine client", len(msgs))
            if closed:
                return

    def _batch(self, items: list[Any]) -> list[Any]:
        """`items` in order, each run of outputs as one CoreOutputs."""
        msgs: list[Any] = []
        run: list[_Output] = []
        for item in items:
            if isinstance(item, _Output):
                run.append(item)
                continue
            if run:
                msgs.append(self._outputs(run))
                run = []
            msgs.append(item)
        if run:
            msgs.append(self._outputs(run))
        return msgs

    def _outputs(self, run: list[_Output]) -> CoreOutputs:
        failure, restarting = self._health()
        outputs = tuple(o.out for o in run)
        return CoreOutputs(outputs, failure, restarting, made_at=run[0].at, sent_at=time.monotonic())


class _Output:
    """An output in the queue, and when it came (other messages are queued as they are)."""

    __slots__ = ("at", "out")

    def __init__(self, out: EngineOutput, at: float) -> None:
        self.out = out
        self.at = at
