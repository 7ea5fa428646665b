"""`GET /v1/debug/state` and its /metrics gauges: sessions, engine tables and process figures; with
several front ends, the counts each holds apart summed into the server's."""

from __future__ import annotations

from typing import Any

import httpx
from starlette.testclient import TestClient

from omnivoice.config import parse_profile
from omnivoice.server import create_app
from omnivoice.server.debug_state import sum_front_ends
from tests.support.fake_engine import FakeEngine, serve_fake


def test_state_lists_sessions_engine_tables_and_process_figures() -> None:
    with serve_fake() as s:
        state = httpx.get(f"{s.url}/v1/debug/state").json()
        metrics = httpx.get(f"{s.url}/metrics").text
    assert state["realtime"] == {
        "sessions": 0,
        "websocket": 0,
        "webrtc_calls": 0,
        "twilio_calls": 0,
        "reserved_slots": 0,
    }
    assert state["requests_in_flight"] == 0
    engine = state["engine"]
    assert engine["active_requests"] == 0 and engine["live_requests"] == 0
    assert [w["name"] for w in engine["workers"]] == ["thinker", "talker", "code2wav"]
    tables = {"queued", "running", "routes", "tombstones", "prefixes", "kv_slots_used", "rss_bytes"}
    assert tables <= engine["workers"][0].keys()
    assert [w["mps_client"] for w in engine["workers"]] == [False] * 3  # no GPU: no MPS
    proc = state["process"]
    assert proc["rss_bytes"] > 10_000_000 and proc["open_fds"] > 3 and proc["asyncio_tasks"] >= 1
    assert proc["shm_segments"] == 0
    for line in (
        'omnivoice_realtime_sessions{transport="websocket"} 0.0',
        "omnivoice_realtime_reserved_slots 0.0",
        'omnivoice_stage_requests{replica="0",stage="talker",table="tombstones"} 0.0',
        'omnivoice_stage_mps_client{replica="0",stage="code2wav"} 0.0',
        "omnivoice_shm_segments 0.0",
        'omnivoice_process_resident_memory_bytes{process="server"}',
        'omnivoice_process_open_fds{process="server"}',
    ):
        assert line in metrics


def test_health_and_metrics_say_how_many_graphs_are_left_for_after_the_start() -> None:
    with serve_fake() as s:
        assert httpx.get(f"{s.url}/health").json() == {"status": "ok"}
        s.engines[0].graphs_pending = 12
        health = httpx.get(f"{s.url}/health")
        metrics = httpx.get(f"{s.url}/metrics").text
    assert health.status_code == 200
    assert health.json() == {"status": "ok", "graphs_pending": {"talker": 12}}
    assert 'omnivoice_stage_graphs_pending{replica="0",stage="talker"} 12.0' in metrics
    assert 'omnivoice_stage_graphs_pending{replica="0",stage="thinker"} 0.0' in metrics
    assert "omnivoice_engine_narrowed_requests" not in metrics


def test_health_metrics_and_state_say_when_the_start_narrowed_the_engine() -> None:
    with serve_fake() as s:
        s.engines[0].narrowed = 4
        health = httpx.get(f"{s.url}/health")
        metrics = httpx.get(f"{s.url}/metrics").text
        state = httpx.get(f"{s.url}/v1/debug/state").json()
    assert health.status_code == 200 and health.json() == {"status": "ok", "narrowed_to": 4}
    assert "omnivoice_engine_narrowed_requests 4.0" in metrics
    assert state["engine"]["narrowed"] == 4


def test_state_is_refused_to_other_than_loopback_clients() -> None:
    app = create_app(parse_profile({}), FakeEngine.factory(None, engines=[]))
    with TestClient(app, base_url="http://localhost") as client:  # its client address is "testclient"
        r = client.get("/v1/debug/state")
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"


def _front(index: int, sessions: int, started: int, dropped: int, wasted_s: float) -> dict[str, Any]:
    counts = {"sessions": sessions, "websocket": sessions, "webrtc_calls": 0, "twilio_calls": 0}
    speculation: dict[str, float] = {"started": started, "confirmed": started - dropped, "dropped": dropped}
    speculation |= {"wasted_tokens": 3 * dropped, "wasted_audio_seconds": wasted_s}
    return {"index": index, "realtime": counts | {"reserved_slots": 0}, "speculative_responses": speculation}


def test_several_front_ends_report_their_sessions_and_speculations_summed() -> None:
    fronts = [_front(1, 2, 5, 1, 0.25), _front(0, 3, 7, 4, 1.5)]
    whole = {
        "realtime": dict(fronts[1]["realtime"]),
        "speculative_responses": dict(fronts[1]["speculative_responses"]),
        "requests_in_flight": 0,
    }
    out = sum_front_ends(whole, fronts)
    assert out["realtime"]["sessions"] == 5 and out["realtime"]["websocket"] == 5
    assert out["speculative_responses"] == {
        "started": 12, "confirmed": 7, "dropped": 5, "wasted_tokens": 15, "wasted_audio_seconds": 1.75,
    }  # fmt: skip
    assert [f["index"] for f in out["front_ends"]] == [0, 1]
