"""Several front-end processes on one port sharing one engine core (`server.front_ends: 2`), over a
real `omnivoice serve` with the tiny model and API keys: both front ends serve and report one server
(/v1/debug/state, /metrics: the engine's families once, each front end's own labelled); chat works
on every connection; the session limits (the server's and each key's) hold for the whole server,
whichever front end took each connection; a client secret minted on one front end is held by every
one; a killed core fails the response in flight, keeps the session, and the next turn is answered by a
fresh core; a killed front end is started again while a session on the other goes on; and a SIGTERM
stops the supervisor, the front ends, the core and its stages. Twilio stream tokens are redeemed once,
on whichever front end minted them."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import websockets
from prometheus_client.parser import text_string_to_metric_families

from omnivoice.bench.server_metrics import scrape as bench_scrape
from tests.server.telephony.test_stream_auth import ended, token_of, twiml
from tests.support.keys import KEY, OTHER_KEY, bearer, ws_url
from tests.support.polling import until, wait_until
from tests.support.realtime_client import Recorder
from tests.support.restart_turns import check_failed_then_answered, interrupted_turn, next_turn
from tests.support.serve_process import ServeProcess, alive, descendants, running, write_profile
from tests.support.twilio_carrier import call

pytestmark = pytest.mark.slow

THREADS = {"max_seq_len": 1024, "worker": "thread", "max_batch": 4}
MAX_SESSIONS = 3  # the server's
KEY_SESSIONS = 2  # each key's
USER = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def server(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    folder = tmp_path_factory.mktemp("front-ends")
    stages = {
        "core": "process", "thinker": THREADS, "talker": THREADS, "code2wav": THREADS,
        "capacity": {"enabled": False},
    }  # fmt: skip
    path = write_profile(
        folder, tiny_checkpoint, server={"port": 0, "front_ends": 2}, stages=stages,
        realtime={"max_sessions": MAX_SESSIONS},
        auth={"rate_limit": {"max_sessions": KEY_SESSIONS}, "max_failed_auth_per_minute": None},
    )  # fmt: skip
    proc = ServeProcess(path, env={"OMNIVOICE_API_KEY": f"{KEY},{OTHER_KEY}"})
    try:
        proc.wait_ready(300)
        yield proc
    finally:
        proc.kill()


def url_of(server: ServeProcess) -> str:
    return f"http://127.0.0.1:{server.port}"


def state(server: ServeProcess) -> dict[str, Any]:
    r = httpx.get(f"{url_of(server)}/v1/debug/state", headers=bearer(KEY), timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def scrape(url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    r = httpx.get(f"{url}/metrics", headers=bearer(KEY), timeout=30)
    assert r.status_code == 200, r.text
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def sdk(server: ServeProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url_of(server)}/v1", api_key=KEY, max_retries=0, timeout=300)


async def first_event(ws: Any) -> dict[str, Any]:
    return json.loads(await ws.recv())  # type: ignore[no-any-return]


def test_both_front_ends_serve_and_report_one_server(server: ServeProcess) -> None:
    s = state(server)
    fronts = s["front_ends"]
    assert [f["index"] for f in fronts] == [0, 1], fronts
    pids = {f["process"]["pid"] for f in fronts}
    assert len(pids) == 2 and server.proc.pid not in pids
    assert s["engine"]["core_pid"] not in pids | {server.proc.pid}
    m = scrape(url_of(server))
    # the engine's families once, unlabelled; each front end's own process with its label
    assert {dict(k).get("front_end") for k in m["omnivoice_stage_steps_total"]} == {None}
    assert {dict(k)["front_end"] for k in m["process_cpu_seconds_total"]} == {"0", "1"}
    assert "serving omnivoice on http://127.0.0.1" in server.log and "(2 front ends)" in server.log


def test_chat_on_many_connections(server: ServeProcess) -> None:
    body = {"model": "omnivoice", "messages": USER, "max_tokens": 3}
    for _ in range(6):
        with httpx.Client(
            base_url=url_of(server), headers=bearer(KEY), timeout=120
        ) as http:  # new connection
            r = http.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text

    def ok() -> float:
        rows = scrape(url_of(server))["omnivoice_requests_total"]
        return sum(v for k, v in rows.items() if dict(k)["status"] == "ok")

    wait_until(lambda: ok() >= 6, 30, "six answered requests counted over the front ends")
    whole = bench_scrape(url_of(server), KEY)  # the benchmarks' reading: the front ends summed
    assert whole is not None and whole["omnivoice_requests_total"][(("status", "ok"),)] == ok()


async def test_the_session_limits_are_the_whole_servers(server: ServeProcess) -> None:
    url = ws_url(url_of(server))
    opened: list[Any] = []
    try:
        for _ in range(KEY_SESSIONS):
            ws = await websockets.connect(url, additional_headers=bearer(KEY))
            opened.append(ws)
            assert (await first_event(ws))["type"] == "session.created"
        # a third of the key's, whichever front end takes it: refused for the key's limit
        async with websockets.connect(url, additional_headers=bearer(KEY)) as ws:
            refused = await first_event(ws)
        assert refused["type"] == "error" and refused["error"]["code"] == "rate_limit_exceeded", refused
        ws = await websockets.connect(url, additional_headers=bearer(OTHER_KEY))
        opened.append(ws)
        assert (await first_event(ws))["type"] == "session.created"
        # the server's limit: MAX_SESSIONS open, over both front ends
        assert state(server)["realtime"]["sessions"] == MAX_SESSIONS
        async with websockets.connect(url, additional_headers=bearer(OTHER_KEY)) as ws:
            refused = await first_event(ws)
        assert refused["type"] == "error" and refused["error"]["code"] == "session_limit_reached", refused
    finally:
        for ws in opened:
            await ws.close()
    await until(lambda: state(server)["realtime"]["reserved_slots"] == 0, 30, "the slots released")


async def test_a_client_secret_is_held_by_every_front_end(server: ServeProcess) -> None:
    r = httpx.post(
        f"{url_of(server)}/v1/realtime/client_secrets", headers=bearer(OTHER_KEY),
        json={"session": {"instructions": "Be brief."}}, timeout=30,
    )  # fmt: skip
    assert r.status_code == 200, r.text
    value = r.json()["value"]
    assert [f["client_secrets"] >= 1 for f in state(server)["front_ends"]] == [True, True]
    for _ in range(3):  # new connections, on either front end
        async with websockets.connect(ws_url(url_of(server)), additional_headers=bearer(value)) as ws:
            created = await first_event(ws)
        assert created["type"] == "session.created" and created["session"]["instructions"] == "Be brief."


async def test_twilio_stream_tokens_are_redeemed_once_whichever_front_end_minted_them(
    server: ServeProcess,
) -> None:
    url = url_of(server)
    tokens = [token_of(twiml(url, auth=("twilio", KEY)).text) for _ in range(3)]
    for token in tokens:  # each call on a new connection, on either front end
        async with call(url) as carrier:
            await carrier.connected()
            await carrier.start(voice="chelsie", omnivoice_token=token)
            await until(lambda: state(server)["realtime"]["twilio_calls"] == 1, 30, "the call's session")
            await carrier.stop()
            await ended(carrier)
        await until(lambda: state(server)["realtime"]["reserved_slots"] == 0, 30, "the call's slot released")
    async with call(url) as again:  # used up, on whichever front end it was minted
        await again.connected()
        await again.start(omnivoice_token=tokens[0])
        assert await ended(again) == 1008


@pytest.mark.timeout(900)
async def test_a_killed_core_fails_the_response_and_the_next_turn_works(server: ServeProcess) -> None:
    before = state(server)["engine"]["core_pid"]

    async def kill_the_core() -> None:
        os.kill(before, signal.SIGKILL)

    async with sdk(server).realtime.connect(model="omnivoice") as conn:
        rec = Recorder(conn)
        cut = await interrupted_turn(conn, rec, url_of(server), kill_the_core)
        done, audio = await next_turn(conn, rec)
        await rec.close()
    check_failed_then_answered(cut, done, audio)
    assert state(server)["engine"]["core_pid"] not in (None, before)
    assert "the engine core (pid" in server.log and "restarting it" in server.log


@pytest.mark.timeout(600)
async def test_a_killed_front_end_is_started_again_and_the_other_goes_on(server: ServeProcess) -> None:
    async with sdk(server).realtime.connect(model="omnivoice") as conn:
        rec = Recorder(conn)
        await rec.next("session.created")
        fronts = state(server)["front_ends"]
        mine = next(f for f in fronts if f["realtime"]["sessions"] == 1)
        other = next(f for f in fronts if f is not mine)
        os.kill(other["process"]["pid"], signal.SIGKILL)
        killed = other["process"]["pid"]
        await until(
            lambda: len({f["process"]["pid"] for f in state(server)["front_ends"]} - {killed}) == 2,
            120, "the killed front end started again",
        )  # fmt: skip
        done, audio = await next_turn(conn, rec)  # the session on the other front end went on
        await rec.close()
    assert done.response.status == "incomplete" and audio
    assert f"front end {other['index']} ended" in server.log


def test_sigterm_stops_every_process(server: ServeProcess) -> None:
    below = descendants(server.proc.pid)
    assert len(below) >= 4  # two front ends, the core, its stages
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(120) == 0, server.log[-3000:]
    deadline = time.monotonic() + 30
    while any(alive(p) for p in below) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in below if alive(p)], running(below)
    assert "omnivoice stopped" in server.log
    assert KEY not in server.log and OTHER_KEY not in server.log
