"""A client that stops reading is dropped, not waited for: the outbox's send timeout and its bound on
queued bytes, for the WebSocket outbox and the Twilio one (fake sockets)."""

from __future__ import annotations

import asyncio
import base64
import time

import pytest

from omnivoice.server.session.outbox import Outbox, OutboxLimits, SlowConsumer
from omnivoice.server.telephony.twilio_outbox import TwilioOutbox


class StuckSocket:
    """Takes `accept` messages, then blocks every send (a peer whose buffers are full)."""

    def __init__(self, accept: int = 0) -> None:
        self.accept = accept
        self.sent: list[str] = []

    async def send_text(self, text: str) -> None:
        if len(self.sent) >= self.accept:
            await asyncio.Event().wait()
        self.sent.append(text)


def delta(n_bytes: int, item: str = "item_1") -> dict:
    b64 = base64.b64encode(bytes(n_bytes)).decode()
    return {"type": "response.output_audio.delta", "response_id": "resp_1", "item_id": item, "delta": b64}


async def test_a_send_blocked_past_the_timeout_fails_the_writer() -> None:
    sock = StuckSocket(accept=2)
    outbox = Outbox(sock.send_text, "sess_1", beta=False, limits=OutboxLimits(1 << 20, send_timeout_s=0.2))
    writer = asyncio.create_task(outbox.run())
    for _ in range(3):
        outbox.put({"type": "session.updated"})
    t0 = time.monotonic()
    with pytest.raises(SlowConsumer, match=r"took nothing for 0\.2 s"):
        await asyncio.wait_for(writer, 5)
    assert time.monotonic() - t0 > 0.15 and len(sock.sent) == 2  # the timeout, not before


async def test_too_much_queued_fails_at_once_even_while_a_send_is_stuck() -> None:
    sock = StuckSocket()
    outbox = Outbox(sock.send_text, "sess_1", beta=False, limits=OutboxLimits(64 * 1024, send_timeout_s=60))
    writer = asyncio.create_task(outbox.run())
    outbox.put(delta(9600))  # 200 ms of pcm16: the writer takes it and blocks
    await asyncio.sleep(0.01)
    for _ in range(5):
        outbox.put(delta(9600))
    assert outbox.failure is None  # ~64 KiB of base64: at the limit, not over
    outbox.drop(lambda e: e["type"] != "response.output_audio.delta")  # a barge-in frees the queue
    for _ in range(5):
        outbox.put(delta(9600))
    assert outbox.failure is None
    outbox.put(delta(9600))
    assert outbox.failure is not None and outbox.failed.is_set()
    assert "bytes of events wait for the client" in str(outbox.failure)
    writer.cancel()
    await asyncio.gather(writer, return_exceptions=True)


async def test_one_event_larger_than_the_bound_is_still_sent() -> None:
    sent: list[str] = []

    async def send(text: str) -> None:
        sent.append(text)

    outbox = Outbox(send, "sess_1", beta=False, limits=OutboxLimits(64 * 1024, send_timeout_s=1))
    writer = asyncio.create_task(outbox.run())
    outbox.put(delta(200_000))  # e.g. conversation.item.retrieve of a long item
    outbox.close()
    await asyncio.wait_for(writer, 5)
    assert len(sent) == 1 and outbox.failure is None


async def test_a_twilio_carrier_that_stops_reading_is_dropped() -> None:
    sock = StuckSocket(accept=3)
    limits = OutboxLimits(1 << 20, send_timeout_s=0.3)
    outbox = TwilioOutbox(sock, "call_1", lambda e: None, ahead_s=10.0, limits=limits)  # type: ignore[arg-type]
    outbox.stream_sid = "MZ1"
    writer = asyncio.create_task(outbox.run())
    outbox.put(delta(8000))  # 1 s of u-law: 50 frames, a few of which go out
    with pytest.raises(SlowConsumer):
        await asyncio.wait_for(writer, 5)
    assert len(sock.sent) == 3
