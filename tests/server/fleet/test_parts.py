"""The parts the front ends of one server share, each on its own: a shared tally holds a limit
exactly across processes adding at once; packets carry a message and a descriptor together; the
whole server's /metrics keeps the engine's families once and labels each front end's own; a
profile with several front ends needs the core in a process of its own."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import threading

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge

from omnivoice.config import ProfileError, RateLimitConfig, parse_profile
from omnivoice.engine.connectors.socket_link import SocketLink
from omnivoice.engine.core.packets import PacketLink
from omnivoice.server.auth.limits import KeyLimits, RateLimited, owner_figures
from omnivoice.server.fleet.answers import LABEL, merge_families
from omnivoice.server.tally import SharedTally

TRIES = 400


def _grab(tally: SharedTally, limit: int, out: object) -> None:
    got = sum(tally.add("in_flight", 1, limit) for _ in range(TRIES))
    out.put(got)  # type: ignore[attr-defined]


def test_a_shared_tally_holds_its_limit_across_processes() -> None:
    ctx = mp.get_context("spawn")
    tally = SharedTally(["in_flight"], ctx)
    out = ctx.Queue()
    procs = [ctx.Process(target=_grab, args=(tally, 500, out)) for _ in range(3)]
    for p in procs:
        p.start()
    got = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
    assert sum(got) == 500 and tally["in_flight"] == 500  # 1200 tries, exactly the limit admitted
    assert tally.add("in_flight", -500)
    assert tally["in_flight"] == 0


def test_key_limits_in_a_shared_tally_are_one_keys() -> None:
    tally = SharedTally([n for owner in ("a", "b") for n in owner_figures(owner)])
    config = RateLimitConfig(requests_per_minute=60, burst=2, max_sessions=1)
    now = [100.0]
    one, other = (KeyLimits(config, clock=lambda: now[0], tally=tally) for _ in range(2))  # two front ends
    one.take("a")
    other.take("a")
    with pytest.raises(RateLimited):
        one.take("a")
    lease = other.claim_session("a")
    with pytest.raises(RateLimited):
        one.claim_session("a")
    assert one.open_sessions() == {"a": 1}
    lease.release()
    one.claim_session("a")
    other.take("b")  # another key's bucket


def test_a_packet_carries_its_descriptor() -> None:
    a, b = PacketLink.pair()
    mine, theirs = socket.socketpair()
    left, right = PacketLink(a), PacketLink(b)
    left.send({"index": 3}, fds=(theirs.fileno(),))
    left.send("plain")
    got = right.recv(timeout=5)
    assert got is not None
    msg, fds = got
    assert msg == {"index": 3} and len(fds) == 1
    theirs.close()
    with socket.socket(fileno=fds[0]) as passed:
        passed.sendall(b"hello")
        assert mine.recv(5) == b"hello"
    assert right.recv_available() == [("plain", [])]
    left.close()
    assert right.recv(timeout=5) is None and right.ended
    mine.close()


def test_a_socket_link_carries_frames_both_ways_and_sees_the_other_side_end() -> None:
    a, b = SocketLink.pair()
    left, right = SocketLink(a), SocketLink(b)
    big = os.urandom(3 << 20)  # more than the socket's buffers: written while the other side reads
    writer = threading.Thread(target=left.put_many, args=(["x", big],))
    writer.start()
    assert right.get(10) == "x" and right.get(10) == big
    writer.join(10)
    right.put("back")
    assert left.get(10) == "back"
    left.close()
    assert right.get(5) is None and right.ended


def _families(index: int) -> list:
    r = CollectorRegistry()
    Counter("omnivoice_requests", "", ["status"], registry=r).labels("ok").inc(index + 1)
    Gauge("omnivoice_stage_running", "", ["stage"], registry=r).labels("thinker").set(7)
    Gauge("omnivoice_requests_in_flight", "", registry=r).set(4)
    return list(r.collect())


def test_the_whole_servers_metrics_keep_the_engines_once_and_label_each_front_ends() -> None:
    merged = {m.name: m for m in merge_families([(1, _families(1)), (0, _families(0))])}
    ok = [s for s in merged["omnivoice_requests"].samples if s.name == "omnivoice_requests_total"]
    assert sorted((s.labels[LABEL], s.value) for s in ok) == [("0", 1.0), ("1", 2.0)]
    running = merged["omnivoice_stage_running"].samples
    assert [(s.labels, s.value) for s in running] == [({"stage": "thinker"}, 7.0)]  # the engine's, once
    assert [s.value for s in merged["omnivoice_requests_in_flight"].samples] == [4.0]  # a shared count


def test_several_front_ends_need_the_core_in_its_own_process() -> None:
    with pytest.raises((ProfileError, ValueError), match="front_ends"):
        parse_profile({"server": {"front_ends": 2}})
    assert parse_profile({"server": {"front_ends": 2}, "stages": {"core": "process"}}).server.front_ends == 2
