"""Live fuzz: the real server (tiny model) takes garbage on every endpoint while a well-behaved client
is served. Every HTTP answer is a 2xx or a 4xx in OpenAI's error shape (never a 5xx, never a hang);
every bad Realtime event gets an `error` event and the session still serves a turn; a Twilio call
drops bad frames and ends cleanly on `stop`; the well-behaved client succeeds throughout.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from omnivoice.config import parse_profile
from omnivoice.server import create_app
from omnivoice.server.session import protocol as p
from tests.support.fuzz_inputs.chat import bodies as chat_bodies
from tests.support.fuzz_inputs.realtime import events as realtime_events
from tests.support.fuzz_inputs.sdp import OFFER, sdp_texts
from tests.support.fuzz_inputs.strategies import pick, raw_bytes
from tests.support.fuzz_inputs.twilio import CONNECTED, MEDIA, START, STOP
from tests.support.fuzz_inputs.twilio import frames as twilio_frames
from tests.support.serve import ServerThread, serve_thread

TIMEOUT = 30.0  # any single answer; a hang fails the test instead of stalling it
WS_LIMIT = 12_000_000  # frames stay under uvicorn's 16 MiB WebSocket limit (a larger one closes 1009)
CAPACITY_CODES = {"server_overloaded", "too_many_requests", "session_limit_reached"}
USER = [{"role": "user", "content": "hi"}]


def budget(n: int) -> int:
    """`n` examples under the `ci` profile, proportionally more under `long`."""
    return max(1, n * settings.default.max_examples // 100)


def live(n: int) -> settings:
    """Settings of a live fuzz test: `budget(n)` examples, no deadline, no example database (the
    examples can be megabytes; failures are printed)."""
    quiet = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
             HealthCheck.large_base_example]  # fmt: skip
    return settings(max_examples=budget(n), deadline=None, suppress_health_check=quiet, database=None)


@pytest.fixture(scope="module")
def srv(tiny_checkpoint: Path) -> Iterator[ServerThread]:
    stage = {"worker": "thread", "max_seq_len": 1024, "max_batch": 4}
    profile = parse_profile(
        {
            "model": {"path": str(tiny_checkpoint)},
            "stages": {  # the talker's frames must fit its context (the default 2048 do not)
                "thinker": stage, "talker": {**stage, "sampling": {"max_tokens": 256}}, "code2wav": stage,
                "capacity": {"enabled": False},  # what a loaded machine measures must not refuse these
            },
            "server": {"max_body_bytes": 4 * 1024 * 1024, "max_audio_seconds": 5.0},
            "realtime": {"max_buffer_seconds": 5.0, "max_event_bytes": 4 * 1024 * 1024,
                         "webrtc_connect_timeout_s": 2.0, "idle_timeout_s": 60.0},
        }
    )  # fmt: skip
    with serve_thread(create_app(profile), wait_healthy=300) as st:
        yield st


def _ws_url(srv: ServerThread, path: str) -> str:
    return srv.base_url.replace("http", "ws", 1) + path


def _ws(srv: ServerThread, path: str) -> ClientConnection:
    return connect(_ws_url(srv, path), open_timeout=TIMEOUT, close_timeout=5, max_size=None, compression=None)


# ---- the well-behaved client -----------------------------------------------------------------------
class GoodClient:
    """Alternates a chat completion (text and audio) and a realtime text turn until stopped; every one
    must succeed."""

    def __init__(self, srv: ServerThread) -> None:
        self.srv = srv
        self.done = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="good-client", daemon=True)

    def __enter__(self) -> GoodClient:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2 * TIMEOUT)

    def _run(self) -> None:
        while not self._stop.is_set():
            for turn in (self._chat, self._realtime):
                try:
                    turn()
                    self.done += 1
                except Exception as e:  # recorded: the test fails on it
                    self.failures.append(f"{turn.__name__}: {e!r}")

    def _chat(self) -> None:
        body = {"messages": USER, "max_tokens": 4, "max_audio_frames": 3, "min_audio_frames": 3}
        r = httpx.post(f"{self.srv.base_url}/v1/chat/completions", json=body, timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][-1]["message"]["audio"]["data"]

    def _realtime(self) -> None:
        with _ws(self.srv, "/v1/realtime") as ws:
            assert _final_turn(ws)["response"]["status"] in ("completed", "incomplete")

    def check(self, since: int) -> None:
        """No failures so far, and at least one more success than `since` (waiting for it)."""
        deadline = time.monotonic() + 2 * TIMEOUT
        while self.done <= since and not self.failures and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not self.failures, self.failures
        assert self.done > since, "the well-behaved client made no progress"


def _state(srv: ServerThread) -> dict[str, Any]:
    r = httpx.get(f"{srv.base_url}/v1/debug/state", timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def baseline(srv: ServerThread) -> dict[str, Any]:
    """The server's state before any client (see test_nothing_is_left_behind)."""
    return _state(srv)


@pytest.fixture(scope="module")
def good(srv: ServerThread, baseline: dict[str, Any]) -> Iterator[GoodClient]:
    with GoodClient(srv) as client:
        yield client


# ---- HTTP: chat completions and WebRTC offers --------------------------------------------------------
def _bounded(body: Any) -> Any:
    """Short generations: a valid body must not keep the tiny model busy for seconds."""
    if isinstance(body, dict):
        body = dict(body)
        for key, cap in (("max_tokens", 4), ("max_completion_tokens", 4), ("max_audio_frames", 3)):
            value = body.get(key)
            if key not in body or (type(value) is int and value > cap):
                body[key] = cap
    return body


def _check_http(r: httpx.Response) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:500])
    if r.status_code >= 400:
        body = r.json()
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
        assert body["error"]["message"]
    elif r.headers.get("content-type", "").startswith("text/event-stream"):
        assert "server_error" not in r.text, r.text[-500:]


CONTENT_TYPES = [
    "application/json",
    "application/json",
    "text/plain",
    "",
    "application/x-www-form-urlencoded",
]
chat_requests = st.tuples(
    pick(
        chat_bodies.map(lambda b: json.dumps(_bounded(b)).encode()),
        chat_bodies.map(lambda b: json.dumps(_bounded(b)).encode()),
        raw_bytes,
    ),
    st.sampled_from(CONTENT_TYPES),
)
offer_requests = pick(
    st.tuples(sdp_texts.map(lambda t: t.encode("utf-8", "surrogatepass")), st.just("application/sdp")),
    st.tuples(
        st.tuples(sdp_texts, st.sampled_from(["offer", "answer", None, 5])).map(
            lambda t: json.dumps({"sdp": t[0], "type": t[1]}).encode()
        ),
        st.just("application/json"),
    ),
    st.tuples(raw_bytes, st.sampled_from(["application/sdp", "application/json", "text/plain"])),
)


def test_http_garbage_gets_4xx_while_a_client_is_served(srv: ServerThread, good: GoodClient) -> None:
    since = good.done
    with httpx.Client(base_url=srv.base_url, timeout=TIMEOUT) as client:

        @live(80)
        @given(chat_requests)
        @example(
            (json.dumps({"messages": [{"role": "user", "content": "\ud800"}]}).encode(), "application/json")
        )
        @example(
            (json.dumps({"messages": USER, "seed": 2**64, "max_tokens": 4}).encode(), "application/json")
        )
        @example((b'{"messages": [' * 50_000, "application/json"))  # deeper than json's recursion limit
        @example((b"x" * (5 * 1024 * 1024), "application/json"))  # over max_body_bytes: 413
        @example((json.dumps({"messages": USER, "max_tokens": 10**30, "modalities": ["text"]}).encode(), ""))
        def chat(request: tuple[bytes, str]) -> None:
            content, ctype = request
            headers = {"content-type": ctype} if ctype else {}
            _check_http(client.post("/v1/chat/completions", content=content, headers=headers))

        @live(50)
        @given(offer_requests)
        @example((OFFER.encode(), "application/sdp"))
        @example((OFFER.replace("a=setup:actpass", "a=setup:holdconn").encode(), "application/sdp"))
        @example((b"[" * 100_000, "application/json"))  # deeper than json's recursion limit: was a 500
        def offer(request: tuple[bytes, str]) -> None:
            content, ctype = request
            r = client.post("/v1/realtime/calls", content=content, headers={"content-type": ctype})
            _check_http(r)
            if r.status_code == 201:  # a valid offer: end the call at once, its session slot is freed
                assert client.post(f"{r.headers['location']}/hangup").status_code == 200

        chat()
        offer()
        # chunked, no Content-Length, larger than max_body_bytes
        chunks = iter([b'{"messages": "' + b"a" * 1024 * 1024] * 6)
        _check_http(client.post("/v1/chat/completions", content=chunks))
    good.check(since)


# ---- Realtime WebSocket ------------------------------------------------------------------------------
def _until(ws: ClientConnection, done: Any) -> list[dict[str, Any]]:
    """Events up to and including the first for which `done(event)`; fails after TIMEOUT."""
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + TIMEOUT
    while True:
        event = json.loads(ws.recv(timeout=max(0.01, deadline - time.monotonic())))
        out.append(event)
        if done(event):
            return out


def _check_events(events: list[dict[str, Any]]) -> None:
    for e in events:
        if e["type"] == "error" and e["error"]["code"] not in CAPACITY_CODES:
            assert e["error"]["type"] == "invalid_request_error", e
        if e["type"] == "response.done" and e["response"]["status"] == "failed":
            error = e["response"]["status_details"]["error"]
            assert error["type"] == "invalid_request_error" or error["code"] in CAPACITY_CODES, e


FINAL = {
    "output_modalities": ["text"], "max_output_tokens": 4, "instructions": "be brief",
    "metadata": {"final": "1"},
}  # fmt: skip


def _final_turn(ws: ClientConnection) -> dict[str, Any]:
    """A normal text turn on `ws`, after whatever it was sent before; its `response.done`."""
    ws.send(json.dumps({"type": "response.cancel", "event_id": "final_cancel"}))
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "still there?"}]}
    ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
    for attempt in range(5):
        ev = f"final_{attempt}"
        ws.send(json.dumps({"type": "response.create", "event_id": ev, "response": FINAL}))

        def ours(e: dict[str, Any], ev: str = ev) -> bool:  # our response's end, or its refusal
            if e["type"] == "response.done":
                return e["response"]["metadata"] == FINAL["metadata"]
            return e["type"] == "error" and e["error"]["event_id"] == ev

        events = _until(ws, ours)
        _check_events(events)
        if events[-1]["type"] == "response.done":
            return events[-1]
        _until(ws, lambda e: e["type"] == "response.done")  # the response in flight ended: try again
    raise AssertionError("no final response")


live_events = realtime_events.filter(lambda e: len(e) < WS_LIMIT)


def test_realtime_garbage_gets_error_events_and_the_session_goes_on(
    srv: ServerThread, good: GoodClient
) -> None:
    since = good.done

    @live(50)
    @given(st.lists(live_events, min_size=1, max_size=4))
    @example([json.dumps({"type": "input_audio_buffer.append", "audio": "AAAA" * 2_000_000})])  # 8 MB
    @example([b"\x00\xff binary"])
    @example(  # text that is not Unicode: kept, it failed every later response
        [json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "\ud800"}]}})]
    )  # fmt: skip
    @example(  # audio shorter than a feature frame: kept, it failed every later response
        [json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_audio", "audio": "AAA="}]}})]
    )  # fmt: skip
    def session(messages: list[str | bytes]) -> None:
        with _ws(srv, "/v1/realtime") as ws:
            _until(ws, lambda e: e["type"] == "session.created")
            for n, message in enumerate(messages):
                ws.send(message)
                probe = f"probe_{n}"
                ws.send(
                    json.dumps({"type": "conversation.item.retrieve", "item_id": probe, "event_id": probe})
                )
                got = _until(ws, lambda e: e["type"] == "error" and e["error"]["event_id"] == probe)  # noqa: B023
                _check_events(got)
                try:
                    p.parse_client_event(message)
                except p.ProtocolError:  # the server must have said so before it answered the probe
                    assert sum(e["type"] == "error" for e in got) >= 2, (message[:200], got)
            assert _final_turn(ws)["response"]["status"] in ("completed", "incomplete")

    session()
    good.check(since)


def test_an_oversized_frame_closes_only_its_own_session(srv: ServerThread, good: GoodClient) -> None:
    since = good.done
    with _ws(srv, "/v1/realtime") as ws:
        _until(ws, lambda e: e["type"] == "session.created")
        with pytest.raises(ConnectionClosed) as closed:  # while sending, or after
            ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": "A" * 20_000_000}))
            _until(ws, lambda e: False)
        rcvd = closed.value.rcvd  # 1009 (message too big), or none if the socket closed while we sent
        assert rcvd is None or rcvd.code == 1009, closed.value
    good.check(since)


# ---- Twilio Media Streams ----------------------------------------------------------------------------
def test_twilio_garbage_is_dropped_and_the_call_ends_cleanly(srv: ServerThread, good: GoodClient) -> None:
    since = good.done
    media = json.dumps(
        {**MEDIA, "media": {**MEDIA["media"], "payload": base64.b64encode(b"\xff" * 160).decode()}}
    )

    @live(50)
    @given(st.lists(twilio_frames.filter(lambda f: len(f) < WS_LIMIT), max_size=6), st.booleans())
    @example(
        [
            json.dumps(
                {**START, "start": {**START["start"], "customParameters": {"output_audio_frames": "9" * 40}}}
            )
        ],
        False,
    )
    @example([json.dumps({"event": ["media"]}), b"\x00"], True)
    def call(frames: list[str | bytes], started: bool) -> None:
        with _ws(srv, "/v1/telephony/twilio") as ws:
            first = [json.dumps(CONNECTED), *([json.dumps(START)] if started else [])]
            with pytest.raises(ConnectionClosed) as closed:  # a valid `stop` among `frames` ends it early
                for frame in [*first, *frames, media, json.dumps(STOP)]:
                    ws.send(frame)
                _until(ws, lambda e: False)  # what the call sends (media, marks) until it hangs up
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000, closed.value

    call()
    good.check(since)


# ---- afterwards ----------------------------------------------------------------------------------------
def _idle(state: dict[str, Any]) -> bool:
    engine = state["engine"]
    return (
        not any(state["realtime"].values())
        and state["requests_in_flight"] == 0
        and engine["active_requests"] == engine["live_requests"] == engine["conversations"] == 0
    )


def test_nothing_is_left_behind(srv: ServerThread, good: GoodClient, baseline: dict[str, Any]) -> None:
    """After all that garbage, once the last client has gone: no session, call, request or
    conversation held anywhere (no session was stuck), and no more open files than before."""
    good.stop()
    assert not good.failures, good.failures
    deadline = time.monotonic() + TIMEOUT
    state = _state(srv)
    while not _idle(state) and time.monotonic() < deadline:
        time.sleep(0.2)
        state = _state(srv)
    assert _idle(state), state
    assert state["process"]["open_fds"] <= baseline["process"]["open_fds"] + 8, (baseline, state)
