"""What a front end asks the others, and answers them (member.py carries the questions): client
secrets and Twilio stream tokens minted on one front end and used on another, a WebRTC call hung up
through another front end than its own, and `/metrics` of the whole server (`/v1/debug/state`'s is
server/debug_state.py's).

`/metrics` of a front end is the server's: the engine's families (the same core behind every front
end) and those the front ends count together (shared.py) once, from the front end asked; every front
end's own families (its requests, sessions, event loop, process) with a `front_end` label each.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.core import Metric

from omnivoice.server.auth.client_secrets import ClientSecret
from omnivoice.server.fleet.member import FleetMember
from omnivoice.server.fleet.messages import (
    CollectMetrics,
    HangUp,
    RedeemStreamToken,
    ShareSecret,
)

# families that are the server's, not one front end's: the engine's, and the shared counts
FLEET_WIDE_PREFIXES = ("omnivoice_stage_", "omnivoice_engine_")
FLEET_WIDE = frozenset(
    {"omnivoice_requests_in_flight", "omnivoice_admitted_streams", "omnivoice_realtime_reserved_slots"}
)
LABEL = "front_end"


def answer_questions(state: Any, member: FleetMember) -> None:
    """Answer the other front ends from this app's state (`app.state`)."""
    auth = state.auth
    member.answer(ShareSecret, lambda q: auth.secrets.add(q.secret))
    member.answer(RedeemStreamToken, lambda q: auth.stream_tokens.redeem(q.value))
    member.answer(HangUp, lambda q: state.webrtc.hang_up(q.call_id))
    member.answer(CollectMetrics, lambda q: (member.index, list(state.metrics.registry.collect())))


async def share_secret(member: FleetMember | None, secret: ClientSecret) -> None:
    """Give every other front end `secret` (returns once they have it, or did not answer)."""
    if member is not None:
        await member.ask(ShareSecret(secret))


async def redeem_elsewhere(member: FleetMember | None, value: str) -> str | None:
    """The owner of Twilio stream token `value` minted on another front end (used up there)."""
    if member is None:
        return None
    return next((owner for owner in await member.ask(RedeemStreamToken(value)) if owner), None)


async def hang_up_elsewhere(member: FleetMember | None, call_id: str) -> bool:
    """Whether another front end served call `call_id`, and hung it up."""
    return member is not None and any(await member.ask(HangUp(call_id)))


async def fleet_metrics(state: Any, member: FleetMember) -> bytes:
    """`/metrics` of the whole server, in Prometheus' text format."""
    own = list(state.metrics.registry.collect())
    answers = [a for a in await member.ask(CollectMetrics()) if a is not None]
    merged = merge_families([(member.index, own), *answers])
    return generate_latest(_Families(merged))


def merge_families(by_front_end: list[tuple[int, list[Metric]]]) -> list[Metric]:
    """One family list of the front ends' (the first is the one asked): fleet-wide samples from the
    first alone, every other sample with its front end's label."""
    families: dict[str, Metric] = {}
    order: list[str] = []
    for n, (index, metrics) in enumerate(by_front_end):
        for m in metrics:
            merged = families.get(m.name)
            if merged is None:
                merged = families[m.name] = Metric(m.name, m.documentation, m.type, m.unit)
                order.append(m.name)
            wide = m.name in FLEET_WIDE or m.name.startswith(FLEET_WIDE_PREFIXES)
            for s in m.samples:
                engine_process = s.labels.get("process", "server") != "server"
                if wide or engine_process:
                    if n == 0:
                        merged.samples.append(s)
                    continue
                merged.samples.append(s._replace(labels={**s.labels, LABEL: str(index)}))
    return [families[name] for name in order]


class _Families:
    """A registry-shaped holder of families, for `generate_latest`."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)
