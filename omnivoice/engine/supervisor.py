"""Stage supervision: notice a dead stage worker and bring the stages back.

A stage process killed mid-request can leave its inbox queue locked and its requests half-way through
every stage, so the supervisor restarts the whole pipeline with fresh connectors rather than one
worker: in-flight requests fail at once with a clear error, new requests get 503 while the stages
come back (seconds), and then the engine serves again. Restarts are rate-limited so a worker that
dies at every start does not loop forever, and held once the server shuts down: a server that drains
lets its responses finish and then stops the stages, so bringing them back would only delay the exit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omnivoice.config import Profile
from omnivoice.engine.pipeline import Pipeline
from omnivoice.engine.restart_budget import RestartBudget

log = logging.getLogger(__name__)


class Supervisor:
    def __init__(self, profile: Profile, source: Path | Any) -> None:
        self._profile = profile
        self._source = source
        self._budget = RestartBudget()
        self._thread: threading.Thread | None = None

    def hold(self) -> None:
        """Restart nothing from now on (the server is shutting down)."""
        self._budget.hold()

    @property
    def restarting(self) -> bool:
        """True while a restart started by `restart_in_background` is under way."""
        return self._thread is not None and self._thread.is_alive()

    def restart_in_background(
        self, old: Pipeline, adopt: Callable[[Pipeline], bool], failed: Callable[[], None]
    ) -> None:
        """Restart the stages on a thread: `adopt(new)` hands the engine the fresh pipeline (False: the
        engine closed meanwhile, so the new pipeline is stopped); `failed()` if the stages cannot start."""

        def run() -> None:
            try:
                new = self.restart(old)
            except Exception:
                log.exception("the stages could not be restarted")
                failed()
                return
            if not adopt(new):
                new.stop()

        self._thread = threading.Thread(target=run, name="engine-restart", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Return once a restart under way has ended (the engine closes)."""
        thread = self._thread
        if thread is not None and thread.is_alive():
            thread.join()

    def refusal(self) -> str | None:
        """Why the stages may not be restarted now, or None if they may."""
        if self._source is None and not self._budget.held:
            return "the engine was started without a model source to restart from"
        return self._budget.refusal()

    def restart(self, old: Pipeline) -> Pipeline:
        """Stop what is left of `old` and start a fresh pipeline (raises if it cannot start)."""
        count = self._budget.spend()
        t0 = time.perf_counter()
        b = self._budget
        log.warning("restarting the stages (%d of %d in %.0f s)", count, b.max_restarts, b.window_s)
        old.stop(timeout=5.0, keep_ray=True)
        new = Pipeline.start(self._profile, self._source, ray=old.ray)
        log.warning("stages restarted in %.1f s", time.perf_counter() - t0)
        return new
