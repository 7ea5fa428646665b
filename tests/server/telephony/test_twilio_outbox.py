"""The Twilio outbox on a fake socket: deltas cut into 20 ms frames closed by marks, pacing, echoed marks
counting audio as played, and barge-in (`clear` first, queued audio dropped, stale echoes ignored)."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from omnivoice.server.telephony.playout import Playout
from omnivoice.server.telephony.twilio_outbox import TwilioOutbox

SID = "MZtest"


class FakeSocket:
    def __init__(self) -> None:
        self.sent: list[tuple[float, dict[str, Any]]] = []

    async def send_text(self, text: str) -> None:
        self.sent.append((time.monotonic(), json.loads(text)))

    def events(self) -> list[str]:
        return [m["event"] for _, m in self.sent]

    def frames(self) -> list[bytes]:
        return [base64.b64decode(m["media"]["payload"]) for _, m in self.sent if m["event"] == "media"]

    def marks(self) -> list[str]:
        return [m["mark"]["name"] for _, m in self.sent if m["event"] == "mark"]


class Harness:
    def __init__(self, ahead_s: float) -> None:
        self.ws = FakeSocket()
        self.other: list[dict[str, Any]] = []
        self.outbox = TwilioOutbox(self.ws, "call_x", self.other.append, ahead_s=ahead_s)  # type: ignore[arg-type]
        self.outbox.stream_sid = SID
        self.played: list[int] = []

    def delta(self, item: str, n_bytes: int, tag: int) -> None:
        event = {
            "type": "response.output_audio.delta",
            "response_id": "resp_1",
            "item_id": item,
            "delta": base64.b64encode(bytes([tag]) * n_bytes).decode(),
        }
        self.outbox.put(event, on_sent=lambda: self.played.append(tag))

    def done(self, item: str) -> None:
        self.outbox.put({"type": "response.output_audio.done", "response_id": "resp_1", "item_id": item})

    async def settle(self, seconds: float = 0.05) -> None:
        await asyncio.sleep(seconds)


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    harness = Harness(ahead_s=10.0)  # no pacing unless a test asks for it
    writer = asyncio.create_task(harness.outbox.run())
    yield harness
    harness.outbox.close()
    await asyncio.wait_for(writer, 1)


async def test_deltas_become_20ms_frames_each_delta_closed_by_a_mark(h: Harness) -> None:
    h.outbox.put({"type": "response.created", "response": {}})
    h.delta("item_a", 1600, 1)
    h.delta("item_a", 1000, 2)  # 6 frames and 40 bytes that wait for the next delta
    h.done("item_a")  # the 40 bytes leave padded with u-law silence, closed by a last mark
    await h.settle()
    frames = h.ws.frames()
    assert [len(f) for f in frames] == [160] * 17
    assert frames[16] == bytes([2]) * 40 + b"\xff" * 120
    events = h.ws.events()
    assert [n for n, e in enumerate(events) if e == "mark"] == [10, 17, 19]
    assert [o["type"] for o in h.other] == ["response.created"]  # no wire for it on Twilio
    assert h.played == []  # nothing is played until the carrier echoes the marks
    _, second, last = h.ws.marks()
    assert h.outbox.playout.echoed(second)  # marks play in order: the first one's audio played too
    assert h.played == [1, 2]
    assert h.outbox.playout.echoed(last) and not h.outbox.playout.echoed("nope")
    assert not h.outbox.playout.playing and h.outbox.interrupt("resp_1") is None
    assert "clear" not in h.ws.events()


async def test_interrupt_sends_clear_first_and_drops_what_was_not_played(h: Harness) -> None:
    h.outbox._ahead_s = 0.1  # paced: most of the 2 s stays queued here
    for tag in range(10):
        h.delta("item_a", 1600, tag)
    await h.settle(0.15)
    first_mark = h.ws.marks()[0]
    assert h.outbox.playout.echoed(first_mark) and h.played == [0]
    pending = h.ws.marks()[1:]
    assert h.outbox.interrupt("resp_1") == "item_a"
    await h.settle()
    events = h.ws.events()
    assert events.count("clear") == 1 and events[-1] == "clear"  # nothing after it
    h.delta("item_a", 1600, 99)  # late audio of the interrupted item
    h.done("item_a")
    for name in pending:  # the carrier echoes the marks it dropped: not played
        h.outbox.playout.echoed(name)
    await h.settle()
    assert h.played == [0] and h.ws.events()[-1] == "clear"
    sent = len(h.ws.frames()) * 0.02
    assert sent < 0.5  # ~0.1 s ahead + 0.2 s elapsed: the rest of the 2 s never left
    assert h.outbox.interrupt(None) is None  # nothing playing any more
    h.delta("item_b", 320, 7)  # the next response plays again
    h.done("item_b")
    await h.settle()
    assert h.ws.events()[-3:] == ["media", "media", "mark"]


async def test_pacing_keeps_at_most_ahead_s_queued_at_the_carrier() -> None:
    harness = Harness(ahead_s=0.2)
    writer = asyncio.create_task(harness.outbox.run())
    t0 = time.monotonic()
    for tag in range(5):
        harness.delta("item_a", 1600, tag)  # 1 s of audio at once
    harness.done("item_a")
    await asyncio.sleep(1.0)
    harness.outbox.close()
    await asyncio.wait_for(writer, 1)
    media = [t for t, m in harness.ws.sent if m["event"] == "media"]
    assert len(media) == 50
    for n, t in enumerate(media):
        assert (n + 1) * 0.02 - (t - t0) <= 0.2 + 0.03  # sent audio minus played time
    assert media[-1] - t0 >= 0.75


def test_playout_marks_and_clear() -> None:
    p = Playout()
    calls: list[str] = []
    assert not p.playing and p.clear() is None
    p.sent_audio("item_a")
    assert p.playing
    m1 = p.sent_mark("item_a", (lambda: calls.append("a"),))
    m2 = p.sent_mark("item_a", (lambda: calls.append("b"),))
    assert p.pending == 2 and p.echoed(m1) and calls == ["a"]
    assert p.clear() == "item_a" and not p.playing
    assert p.echoed(m2) and calls == ["a"]  # stale: its audio was dropped, not played
    assert not p.echoed(m2)
