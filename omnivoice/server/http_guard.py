"""Slow and greedy clients, at the connection: uvicorn's h11 protocol with a header timeout and a cap
on the connections of one client address.

- A connection must send a request's complete headers within `server.header_timeout_s` of opening or
  of its previous response. uvicorn has no such limit (its keep-alive timeout stops at the first
  byte), so a client sending its headers a byte at a time held a connection and a file descriptor
  for ever. With part of a request received the client gets 408; an idle connection is just closed.
- A client address may hold `server.max_connections_per_client` connections (HTTP, or upgraded to
  WebSocket: they are counted by transport); the next one is closed at once. An IPv6 client is its
  /64 (one host gets a whole /64). Trusted proxies (`server.trusted_proxies`) are exempt: all their
  clients share their address.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from omnivoice.server.errors import APIError

log = logging.getLogger(__name__)

SWEEP_EVERY = 1024  # admissions between sweeps of addresses whose connections have all closed


@dataclass
class _Client:
    transports: set[asyncio.BaseTransport] = field(default_factory=set)
    refused: int = 0  # connections refused since the last one admitted


class ClientConnections:
    """Open connections per client address, so that one address cannot take them all."""

    def __init__(self, limit: int | None, exempt: Sequence[str] = ()) -> None:
        self.limit = limit
        self._exempt = [ipaddress.ip_network(n, strict=False) for n in exempt]
        self._clients: dict[str, _Client] = {}
        self._admitted = 0

    def admit(self, address: str, transport: asyncio.BaseTransport) -> bool:
        """Count `transport` against `address`; False (and it must be closed) if that is one too many."""
        if self.limit is None or self._is_exempt(address):
            return True
        client = self._clients.setdefault(client_key(address), _Client())
        client.transports = {t for t in client.transports if not t.is_closing()}
        if len(client.transports) >= self.limit:
            client.refused += 1
            if client.refused == 1:  # once per run of refusals: anyone can provoke them
                log.warning("client %s has %d connections open; refusing more", address, self.limit)
            return False
        client.transports.add(transport)
        client.refused = 0
        self._admitted += 1
        if self._admitted % SWEEP_EVERY == 0:
            self._sweep()
        return True

    def _is_exempt(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in self._exempt)

    def _sweep(self) -> None:
        for address, client in list(self._clients.items()):
            if all(t.is_closing() for t in client.transports):
                del self._clients[address]


def client_key(address: str) -> str:
    """Whose connection it is: the IPv4 address, or the IPv6 address's /64."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


class GuardedH11(H11Protocol):
    """H11Protocol with the header timeout and the connection cap; `guarded_h11` makes the class a
    server uses, with its settings."""

    header_timeout_s: ClassVar[float]
    client_connections: ClassVar[ClientConnections]

    _header_timer: asyncio.TimerHandle | None = None
    _armed_cycle: object = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self.client_connections.admit(self.client[0] if self.client else "", transport):
            transport.close()
            return
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._header_timer is not None and self.cycle is not self._armed_cycle:
            self._disarm()  # a request's headers are in: it has started

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._disarm()  # the WebSocket protocol takes the connection over
        super().handle_websocket_upgrade(event)

    def on_response_complete(self) -> None:
        if not self.transport.is_closing():
            self._arm()  # before uvicorn starts a pipelined request, which then disarms it
        super().on_response_complete()

    def _arm(self) -> None:
        self._disarm()
        self._armed_cycle = self.cycle
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.cycle is not self._armed_cycle or self.transport.is_closing():
            return  # a request started meanwhile
        if self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:
            client = self.client[0] if self.client else "?"
            log.info("client %s: no complete request headers within %g s", client, self.header_timeout_s)
            self.transport.write(_timeout_response(self.header_timeout_s))
        self.transport.close()


def guarded_h11(header_timeout_s: float, connections: ClientConnections) -> type[GuardedH11]:
    """The protocol class for one server: its header timeout and its table of connections."""
    settings = {"header_timeout_s": header_timeout_s, "client_connections": connections}
    return type("GuardedH11", (GuardedH11,), settings)


def _timeout_response(timeout_s: float) -> bytes:
    message = f"the request headers did not arrive within {timeout_s:g} s"
    body = json.dumps(APIError(408, message, code="request_timeout").body()).encode()
    head = (
        "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body
