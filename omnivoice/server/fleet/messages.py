"""What the supervisor and its front ends say to each other, over each front end's packet socket
(engine/core/packets.py).

Supervisor -> front end: the core's start steps (engine StartStep/CoreExpect), `CoreAttach` (with the
front end's end of a link to the core ready now), `CoreLost`, `CoreFailed`, `Stop`, and questions of
the other front ends (`Ask`, with `origin` set) and their answers (`Answers`).
Front end -> supervisor: `FrontEndUp` once it serves, `Ask` (a question for every other front end)
and `Answer`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omnivoice.server.auth.client_secrets import ClientSecret


@dataclass(frozen=True)
class CoreAttach:
    """A core is ready; the packet carries this front end's end of its link to it."""

    generation: int
    pid: int


@dataclass(frozen=True)
class CoreLost:
    """The core of `generation` ended: its requests fail with `failure`; `restarting`: a new one comes."""

    generation: int
    failure: str
    restarting: bool


@dataclass(frozen=True)
class CoreFailed:
    """A core could not be started (the first: the server does not start)."""

    error: str


@dataclass(frozen=True)
class Stop:
    """The supervisor got a stop signal: act as on one (the first drains, the next cancels)."""


@dataclass(frozen=True)
class FrontEndUp:
    """The front end serves: its engine client has a core and its server takes connections."""

    index: int
    pid: int


# -- the questions one front end puts to all the others


@dataclass(frozen=True)
class ShareSecret:
    """A client secret minted here: keep it, so a session may open with it on any front end."""

    secret: ClientSecret


@dataclass(frozen=True)
class RedeemStreamToken:
    """A Twilio stream's one-use token: its owner if it was minted there (and is used up there)."""

    value: str


@dataclass(frozen=True)
class HangUp:
    """Hang up the WebRTC call `call_id` if it is served there (answers whether it was)."""

    call_id: str


@dataclass(frozen=True)
class CollectMetrics:
    """That front end's own metric families (its sessions, requests and event loop)."""


@dataclass(frozen=True)
class DebugState:
    """That front end's part of /v1/debug/state."""


Query = ShareSecret | RedeemStreamToken | HangUp | CollectMetrics | DebugState


@dataclass(frozen=True)
class Ask:
    """A question for every other front end; `origin` is the asking one (set by the supervisor)."""

    seq: int
    query: Query
    origin: int = -1


@dataclass(frozen=True)
class Answer:
    seq: int
    origin: int
    value: Any


@dataclass(frozen=True)
class Answers:
    """The other front ends' answers to the asker's question `seq` (those that answered in time)."""

    seq: int
    values: tuple[Any, ...]
