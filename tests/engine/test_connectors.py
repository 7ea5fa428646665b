import multiprocessing as mp
import os

import numpy as np
import pytest

from omnivoice.engine.connectors import LocalConnector, ShmConnector
from omnivoice.messages import CodecChunk, ThinkerChunk


def _shm_segments() -> set[str]:
    if not os.path.isdir("/dev/shm"):
        return set()
    return {n for n in os.listdir("/dev/shm") if n.startswith("psm_")}


def _echo(inbox: ShmConnector, outbox: ShmConnector) -> None:
    while True:
        msg = inbox.get(timeout=10)
        if msg is None or msg == "stop":
            return
        outbox.put(msg)


@pytest.mark.parametrize("size", [4, 200_000])
def test_shm_connector_round_trip_across_processes(size: int) -> None:
    before = _shm_segments()
    ctx = mp.get_context("spawn")
    a, b = ShmConnector(ctx), ShmConnector(ctx)
    p = ctx.Process(target=_echo, args=(a, b))
    p.start()
    try:
        embeds = np.random.default_rng(0).standard_normal((size // 64 + 1, 64)).astype(np.float32)
        a.put(ThinkerChunk("r1", (1, 2), embeds, False))
        a.put(CodecChunk("r1", np.arange(32, dtype=np.int64).reshape(16, 2), True))
        first = b.get(timeout=20)
        second = b.get(timeout=20)
        assert isinstance(first, ThinkerChunk) and first.token_ids == (1, 2)
        np.testing.assert_array_equal(first.token_embeds, embeds)
        assert isinstance(second, CodecChunk) and second.finished
        np.testing.assert_array_equal(second.frames, np.arange(32).reshape(16, 2))
        a.put("stop")
    finally:
        p.join(20)
        a.close()
        b.close()
    assert _shm_segments() - before == set(), "shared-memory segments leaked"


def test_shm_close_unlinks_undelivered_payloads() -> None:
    before = _shm_segments()
    c = ShmConnector()
    c.put(CodecChunk("r", np.zeros((16, 10_000), dtype=np.int64), False))
    c.close()
    assert _shm_segments() - before == set()


def test_local_connector_drain_and_timeout() -> None:
    c = LocalConnector()
    assert c.get(timeout=0.01) is None
    for i in range(3):
        c.put(i)
    assert c.get(timeout=0) == 0
    assert c.drain() == [1, 2]
    assert c.drain() == []
