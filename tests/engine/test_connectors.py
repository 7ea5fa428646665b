import multiprocessing as mp
import os
import pickle
import struct
import time

import numpy as np
import pytest

from omnivoice.engine.connectors import LocalConnector, ShmConnector
from omnivoice.engine.connectors.pipe import PipeConnector
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


@pytest.mark.parametrize("size", [4, 200_000])
def test_shm_put_many_arrives_in_order_across_processes(size: int) -> None:
    before = _shm_segments()
    ctx = mp.get_context("spawn")
    a, b = ShmConnector(ctx), ShmConnector(ctx)
    p = ctx.Process(target=_echo, args=(a, b))
    p.start()
    try:
        rng = np.random.default_rng(1)
        embeds = [rng.standard_normal((size // 64 + 1, 64)).astype(np.float32) for _ in range(3)]
        a.put_many([ThinkerChunk(f"r{i}", (i,), e, False) for i, e in enumerate(embeds)])
        a.put_many([])
        a.put(CodecChunk("r9", np.zeros((16, 1), dtype=np.int64), True))
        got = [b.get(timeout=20) for _ in range(4)]
        assert [m.request_id for m in got] == ["r0", "r1", "r2", "r9"]
        for m, e in zip(got[:3], embeds, strict=True):
            np.testing.assert_array_equal(m.token_embeds, e)
            m.token_embeds[0, 0] = 1.0  # arrays come out writable
        a.put("stop")
    finally:
        p.join(20)
        a.close()
        b.close()
    assert _shm_segments() - before == set(), "shared-memory segments leaked"


def test_shm_drain_hands_out_every_message_of_a_batch() -> None:
    c = ShmConnector()
    try:
        c.put_many([CodecChunk(f"r{i}", np.zeros((16, 1), dtype=np.int64), False) for i in range(3)])
        c.put_many([CodecChunk("r3", np.zeros((16, 1), dtype=np.int64), True)])
        first = c.get(timeout=5)
        rest = [m.request_id for m in c.drain()]
        deadline = time.monotonic() + 10
        while len(rest) < 3 and time.monotonic() < deadline:  # the second item may still be on its way
            rest += [m.request_id for m in c.drain()]
        assert first is not None and first.request_id == "r0"
        assert rest == ["r1", "r2", "r3"]
    finally:
        c.close()


def test_local_connector_put_many_keeps_order() -> None:
    c = LocalConnector()
    c.put_many([1, 2])
    c.put(3)
    assert c.drain() == [1, 2, 3]


def _send_frames(channel: PipeConnector, frames: int, size: int) -> None:
    """A writing process: `frames` frames of three messages, the middle one `size` float32s."""
    for i in range(frames):
        pcm = np.full(size, i, dtype=np.float32)
        channel.put_many([f"start {i}", CodecChunk(f"r{i}", pcm.reshape(1, -1), False), f"end {i}"])
    channel.put("last")


@pytest.mark.parametrize("size", [4, 300_000])  # a frame far larger than a pipe's default buffer
def test_pipe_connector_carries_frames_in_order_and_sees_its_writer_end(size: int) -> None:
    ctx = mp.get_context("spawn")
    channel = PipeConnector(ctx)
    writer = ctx.Process(target=_send_frames, args=(channel, 3, size))
    writer.start()
    channel.close_writing_end()
    try:
        got = [channel.get(timeout=20) for _ in range(10)]
        for i in range(3):
            start, chunk, end = got[3 * i : 3 * i + 3]
            assert (start, end) == (f"start {i}", f"end {i}")
            assert isinstance(chunk, CodecChunk) and chunk.request_id == f"r{i}"
            np.testing.assert_array_equal(chunk.frames, np.full((1, size), i, dtype=np.float32))
            assert chunk.frames.flags.writeable  # as a stage's own arrays are
        assert got[9] == "last"
        writer.join(20)
        t0 = time.monotonic()
        assert channel.get(timeout=0.2) is None  # the writer is gone: the pipe has ended
        assert channel.get(timeout=0.2) is None and time.monotonic() - t0 >= 0.3  # waits, no spinning
    finally:
        writer.join(20)
        channel.close()


def test_pipe_drain_hands_out_the_rest_of_a_frame_and_every_frame_after_it() -> None:
    channel = PipeConnector(mp.get_context("spawn"))
    channel.put_many([1, 2, 3])
    channel.put_many([4])
    assert channel.get(timeout=1) == 1
    assert channel.drain() == [2, 3, 4]
    assert channel.get(timeout=0) is None
    channel.close()


def test_pipe_reading_never_waits_on_a_frame_written_in_part() -> None:
    """A writer stopped mid-frame (a core frozen or killed while writing) must not block its reader:
    the event loop reads the pipe itself."""
    channel = PipeConnector(mp.get_context("spawn"))
    data = pickle.dumps(["whole"], protocol=5)
    fd = channel._writer.fileno()
    os.write(fd, struct.pack("<Q", len(data)) + data[: len(data) // 2])
    t0 = time.monotonic()
    assert channel.read_available() == []  # half a frame: nothing yet, and no wait for the rest
    assert channel.get(timeout=0.1) is None
    assert time.monotonic() - t0 < 5
    os.write(fd, data[len(data) // 2 :])
    assert channel.read_available() == ["whole"]
    channel.close()
