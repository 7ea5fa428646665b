"""The first engine core, started as early as the server can: before the server imports its HTTP stack
and the model stack (transformers: seconds), so that the core's start (its imports, its stages'
forkserver, minutes of compiling and capturing on a GPU) runs beside them instead of after them.

A module of light imports only (the profile, the core's handle, the model's name): `omnivoice serve`
begins a launch right after it reads the profile, and the engine client takes the launched core over
once it has loaded the model (engine/core/client.py). Until then what the core says (its start steps,
ready, or its exit) is held in order by the launch's relay and handed to the client when it attaches.
A launch that no client took (the server failed to bind its port, say) is stopped by `close`.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Protocol

from omnivoice.config import Profile
from omnivoice.engine.core.handle import CoreHandle
from omnivoice.engine.model_source import resolve_model_path
from omnivoice.models.dummy_source import DummySource

log = logging.getLogger(__name__)


class CoreListener(Protocol):
    """What hears a core: the engine client."""

    def _on_message(self, handle: CoreHandle, msg: Any) -> None: ...

    def _on_exit(self, handle: CoreHandle) -> None: ...


class Relay:
    """A core's messages and exit until its listener exists: held in order, then handed to the
    listener on `attach`, and later ones passed straight on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: list[tuple[CoreHandle, Any]] = []  # (handle, message), or (handle, _EXITED)
        self._listener: CoreListener | None = None

    def message(self, handle: CoreHandle, msg: Any) -> None:
        with self._lock:
            if self._listener is None:
                self._held.append((handle, msg))
            else:
                _deliver(self._listener, handle, msg)

    def exit(self, handle: CoreHandle) -> None:
        self.message(handle, _EXITED)

    def attach(self, listener: CoreListener) -> None:
        with self._lock:
            for handle, msg in self._held:
                _deliver(listener, handle, msg)
            self._held.clear()
            self._listener = listener


def _deliver(listener: CoreListener, handle: CoreHandle, msg: Any) -> None:
    if msg is _EXITED:
        listener._on_exit(handle)
    else:
        listener._on_message(handle, msg)


_EXITED = object()


class CoreLaunch:
    """The first core of a server (generation 1), started by `begin`, taken over by one client."""

    def __init__(self, profile: Profile, source: Path | DummySource) -> None:
        self.source = source
        self.relay = Relay()
        self.handle = CoreHandle(profile, source, 1, self.relay.message, self.relay.exit)
        self._lock = threading.Lock()
        self._taken = False

    @classmethod
    def begin(cls, profile: Profile) -> CoreLaunch:
        """Resolve the profile's model and start its core process (returns at once). Raises what
        resolving the model raises (no core is started then)."""
        launch = cls(profile, resolve_model_path(profile))
        launch.handle.start()
        return launch

    def take(self) -> CoreLaunch:
        """Hand the launched core to its client (once; a second take raises RuntimeError)."""
        with self._lock:
            if self._taken:
                raise RuntimeError("the launched engine core was already taken")
            self._taken = True
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Stop the core if no client took it (a client stops the core it owns itself)."""
        with self._lock:
            if self._taken:
                return
            self._taken = True
        log.info("stopping the engine core started for a server that did not start")
        self.handle.stop(timeout)
