"""The first engine core starts before the server has loaded the model: what it says meanwhile is
held and handed, in order, to the engine client once that exists (engine/core/launch.py's Relay)."""

from __future__ import annotations

from typing import Any, cast

from omnivoice.engine.core.handle import CoreHandle
from omnivoice.engine.core.launch import Relay


class Heard:
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def _on_message(self, handle: Any, msg: Any) -> None:
        self.events.append(("message", msg))

    def _on_exit(self, handle: Any) -> None:
        self.events.append(("exit", handle))


def test_what_the_core_says_before_the_client_exists_reaches_it_in_order() -> None:
    relay, handle, heard = Relay(), cast(CoreHandle, object()), Heard()
    relay.message(handle, "step 1")
    relay.message(handle, "step 2")
    assert heard.events == []
    relay.attach(heard)
    assert heard.events == [("message", "step 1"), ("message", "step 2")]
    relay.message(handle, "ready")  # once attached, straight through
    relay.exit(handle)
    assert heard.events[2:] == [("message", "ready"), ("exit", handle)]


def test_a_core_that_ended_before_the_client_existed_is_reported_as_ended() -> None:
    relay, handle, heard = Relay(), cast(CoreHandle, object()), Heard()
    relay.message(handle, "step 1")
    relay.exit(handle)
    relay.attach(heard)
    assert heard.events == [("message", "step 1"), ("exit", handle)]
