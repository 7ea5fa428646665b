"""How the server delivers a response's audio (session/delivery.py): the pacer counts the seconds a
player would have waited when audio comes slower than real time, and /metrics exports each response's
first text and audio and its underrun, as the server queued them."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import httpx
import pytest

from omnivoice.server.session.pacing import Pacer
from tests.support.fake_engine import FakeServer, Script, serve_realtime
from tests.support.realtime_client import respond_to_text

# 0.1 s chunks, one every 0.3 s at least: a player waits 0.2 s or more before each chunk after the first
SLOW = Script(texts=("Hi", " there", " you", " all"), audio_chunks=4, chunk_samples=2400, delay=0.3)


async def test_the_pacer_counts_the_players_dry_spells() -> None:
    pacer, never = Pacer(ahead_s=1.0), asyncio.Event()
    assert await pacer.wait(0.1, never) and pacer.dry_s == 0.0  # the first audio starts the player
    await asyncio.sleep(0.3)  # the next 0.1 s comes 0.3 s (or more, on a busy machine) later
    assert await pacer.wait(0.1, never)
    assert pacer.dry_s >= 0.2 - 1e-3
    before = pacer.dry_s
    assert await pacer.wait(5.0, never)  # sent at once: nothing had played out yet
    assert await pacer.wait(0.1, never)  # 5 s queued: held back, no dry spell
    assert pacer.dry_s == before


@pytest.fixture(scope="module")
def srv() -> Iterator[FakeServer]:
    with serve_realtime(SLOW, max_audio_ahead_ms=1000) as s:
        yield s


def sample(metrics: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} (\S+)$", metrics, re.M)
    assert found is not None, name
    return float(found[1])


async def test_metrics_say_when_a_response_began_to_speak_and_how_long_its_player_waited(
    srv: FakeServer,
) -> None:
    done = await respond_to_text(srv.url)
    assert done.status == "completed"
    m = httpx.get(f"{srv.url}/metrics", timeout=10).text
    for phase in ("first_text", "first_audio"):
        assert sample(m, f'omnivoice_realtime_response_seconds_count{{phase="{phase}"}}') == 1
    # the first audio follows the first text by a delay of the script at least
    took = {
        p: sample(m, f'omnivoice_realtime_response_seconds_sum{{phase="{p}"}}')
        for p in ("first_text", "first_audio")
    }
    assert took["first_audio"] >= took["first_text"] + 0.3 - 1e-3
    assert sample(m, "omnivoice_realtime_playback_underrun_seconds_count") == 1
    # three late chunks, each 0.2 s or more after the player ran dry
    assert sample(m, "omnivoice_realtime_playback_underrun_seconds_sum") >= 3 * 0.2 - 1e-3
