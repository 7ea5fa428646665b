"""`GET /v1/debug/state`: what the server holds right now, for leak checks (`omnivoice bench soak`).

Open realtime sessions by transport (WebSocket, WebRTC, Twilio) and their reserved slots, the counts
of speculative responses (started, confirmed, dropped, the work the dropped ones wasted), admitted
requests, the engine's request tables per stage worker (the workers report theirs with their stats,
so process workers and Ray actors are covered), and process figures: resident memory and open fds of
the server and of every stage worker process, asyncio tasks, and the shared-memory segments the
server's connectors have in /dev/shm. After the last client has gone, every count but the process
figures, the tombstones (aborted ids, forgotten after `stage.TOMBSTONE_TTL_S`) and the speculative
responses' (totals since the start) is back to 0.

It names no user data, but it is no public API: besides the auth middleware's check (an API key when
keys are configured), it answers only loopback clients or requests made with an API key (403).
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from omnivoice.engine.process_stats import process_stats, shm_segments
from omnivoice.server.auth.keys import ANONYMOUS, is_loopback
from omnivoice.server.auth.principal import principal_of
from omnivoice.server.errors import APIError
from omnivoice.server.fleet.member import FleetMember
from omnivoice.server.fleet.messages import DebugState

TWILIO_PREFIX = "call_"  # TwilioCall ids (and their sessions')


async def debug_state(request: Request) -> Response:
    client = request.client.host if request.client else ""
    if not is_loopback(client) and principal_of(request).owner == ANONYMOUS:
        message = "the debug state is served to loopback clients and API keys only"
        raise APIError(403, message, code="forbidden")
    fleet = request.app.state.fleet
    if fleet is not None:  # one front end of several: the whole server's, and each front end's
        return JSONResponse(await fleet_snapshot(request.app.state, fleet))
    return JSONResponse(snapshot(request.app.state))


async def fleet_snapshot(state: Any, member: FleetMember) -> dict[str, Any]:
    """The whole server's state (`snapshot`), with each front end's own part (`front_end_state`)
    under "front_ends" and what they hold apart summed over them (`sum_front_ends`)."""
    fronts = [front_end_state(state, member), *(a for a in await member.ask(DebugState()) if a is not None)]
    return sum_front_ends(snapshot(state), fronts)


def sum_front_ends(whole: dict[str, Any], fronts: list[dict[str, Any]]) -> dict[str, Any]:
    """`whole` (one front end's `snapshot`) made the server's: the realtime session counts and the
    speculative responses summed over `fronts` (each front end's `front_end_state`), which it then
    lists in index order under "front_ends"."""
    fronts = sorted(fronts, key=lambda f: f["index"])
    counts = whole["realtime"]
    for key in ("sessions", "websocket", "webrtc_calls", "twilio_calls"):
        counts[key] = sum(f["realtime"][key] for f in fronts)
    whole["speculative_responses"] = {
        key: sum(f["speculative_responses"][key] for f in fronts) for key in whole["speculative_responses"]
    }
    whole["front_ends"] = fronts
    return whole


def front_end_state(state: Any, member: FleetMember) -> dict[str, Any]:
    """One front end's part of the server's state (what it answers the others' DebugState)."""
    return {
        "index": member.index,
        "realtime": realtime_counts(state),
        "client_secrets": len(state.auth.secrets),
        "speculative_responses": state.realtime.speculation.wire(),
        "process": server_process(),
    }


def snapshot(state: Any) -> dict[str, Any]:
    """The whole state as JSON-able data; call it on the server's event loop."""
    return {
        "realtime": realtime_counts(state),
        "speculative_responses": state.realtime.speculation.wire(),
        "requests_in_flight": state.admission.in_flight,
        "admitted_streams": state.admission.streams,
        "engine": engine_tables(state),
        "process": server_process(),
    }


def realtime_counts(state: Any) -> dict[str, int]:
    service, calls = state.realtime, state.webrtc
    webrtc = {c.session.id for c in calls.calls.values()}
    twilio = sum(1 for sid in service.sessions if sid.startswith(TWILIO_PREFIX))
    return {
        "sessions": len(service.sessions),
        "websocket": len(service.sessions) - twilio - len(webrtc & service.sessions.keys()),
        "webrtc_calls": len(calls.calls),
        "twilio_calls": twilio,
        "reserved_slots": service.reserved,
    }


def engine_tables(state: Any) -> dict[str, Any] | None:
    """The engine's request tables: its own, and each stage worker's; None while it is not up."""
    lifecycle = state.lifecycle
    if lifecycle.state != "ready":
        return None
    engine = lifecycle.engine
    stats = engine.stats()
    workers = []
    for s in engine.replica_stats():
        row = asdict(s)
        row["live_requests"] = s.live_requests
        workers.append(row)
    return {
        "core_pid": engine.core_pid,
        "active_requests": stats.active_requests,
        "conversations": stats.conversations,
        "routed": stats.routed,
        "live_requests": sum(s.live_requests for s in stats.stages),
        "capacity": asdict(stats.capacity) if stats.capacity is not None else None,
        "narrowed": stats.narrowed,
        "workers": workers,
    }


def _tasks() -> int:
    try:
        return len(asyncio.all_tasks())
    except RuntimeError:  # not called on the event loop
        return 0


def server_process() -> dict[str, Any]:
    proc = process_stats()
    return {
        "pid": proc.pid,
        "rss_bytes": proc.rss_bytes,
        "open_fds": proc.open_fds,
        "threads": proc.threads,
        "asyncio_tasks": _tasks(),
        "shm_segments": shm_segments(),
    }
