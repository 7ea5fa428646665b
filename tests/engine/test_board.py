"""The priority board: one entry per stage worker, seen by the workers that share its device, across
threads and across stage processes."""

from __future__ import annotations

import multiprocessing as mp

from omnivoice.engine.board import IDLE, PriorityBoard, Seat, seats
from omnivoice.runners.priority import Priority


def test_peers_are_the_workers_on_the_same_device() -> None:
    workers = [("thinker", "cuda:0"), ("talker", "cuda"), ("code2wav", "cuda:1")]
    workers += [("x", "cpu"), ("y", "cpu:0")]
    board = PriorityBoard.local(len(workers))
    seat = seats(board, workers)
    assert seat["thinker"].peers == (1,)  # "cuda" is cuda:0
    assert seat["code2wav"].peers == ()
    assert seat["x"].peers == (4,)  # every CPU worker shares the cores
    seat["talker"].publish(Priority.FIRST)
    assert seat["thinker"].peer_urgent() and not seat["code2wav"].peer_urgent()
    seat["talker"].publish(Priority.AHEAD)
    assert not seat["thinker"].peer_urgent()
    seat["talker"].publish(None)
    assert board.read(1) is None


def _child(seat: Seat, results: mp.Queue) -> None:  # type: ignore[type-arg]
    results.put(seat.peer_urgent())  # the parent published DRY before starting this process
    seat.publish(Priority.FIRST)
    results.put("published")


def test_stage_processes_share_the_board() -> None:
    ctx = mp.get_context("spawn")
    board = PriorityBoard.shared(ctx, 2)
    assert [board.read(i) for i in range(2)] == [None, None] and len(Priority) == IDLE
    parent, child = seats(board, [("server", "cpu"), ("stage", "cpu")]).values()
    parent.publish(Priority.DRY)
    results = ctx.Queue()
    p = ctx.Process(target=_child, args=(child, results))
    p.start()
    try:
        assert results.get(timeout=60) is True
        assert results.get(timeout=10) == "published"
    finally:
        p.join(10)
    assert p.exitcode == 0
    assert board.read(1) == Priority.FIRST and parent.peer_urgent()
