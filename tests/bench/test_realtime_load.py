"""The realtime load's callers against a scripted `/v1/realtime` server: a session speaks only once its
`session.update` is accepted; one the server refuses fails instead of being measured on its defaults,
except for the speculative-response key a server from before that extension does not know."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import websockets

from omnivoice.bench.realtime_load import (
    RATE,
    SPECULATIVE_PARAM,
    RealtimeLoadConfig,
    TurnRecord,
    run_realtime_load,
)
from omnivoice.cli import main

SPEECH = b"\x10\x00" * (RATE // 10)  # 100 ms of non-silent pcm16


def _error(message: str, code: str, param: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": "invalid_request_error", "code": code, "message": message,
                                       "param": param}}  # fmt: skip


class ScriptedServer:
    """Refuses a `session.update` carrying any key of `unknown` (as a strict server does, nothing of it
    applies), else answers `session.updated`; ends a turn at the first silent append after speech with
    `speech_stopped`, one audio delta and `response.done`. Keeps every session object it accepted."""

    def __init__(self, unknown: frozenset[str]) -> None:
        self.unknown = unknown
        self.accepted: list[dict[str, Any]] = []
        self.appends_before_update = 0

    async def handle(self, ws: Any) -> None:
        await ws.send(json.dumps({"type": "session.created", "session": {}}))
        configured, speaking = False, False
        async for message in ws:
            event = json.loads(message)
            if event["type"] == "session.update":
                session = event["session"]
                bad = sorted(k for k in session.get("omnivoice", {}) if k in self.unknown)
                if bad:
                    param = f"session.omnivoice.{bad[0]}"
                    await ws.send(
                        json.dumps(_error(f"Unknown parameter: '{param}'.", "unknown_parameter", param))
                    )
                else:
                    configured = True
                    self.accepted.append(session)
                    await ws.send(json.dumps({"type": "session.updated", "session": session}))
            elif event["type"] == "input_audio_buffer.append":
                if not configured:
                    self.appends_before_update += 1
                silent = not any(base64.b64decode(event["audio"]))
                if not silent:
                    speaking = True
                elif speaking:
                    speaking = False
                    delta = base64.b64encode(bytes(480)).decode()
                    for reply in (
                        {"type": "input_audio_buffer.speech_stopped"},
                        {"type": "response.output_audio.delta", "delta": delta},
                        {"type": "response.done", "response": {"status": "completed"}},
                    ):
                        await ws.send(json.dumps(reply))


def _run(unknown: frozenset[str], speculative: bool | None) -> tuple[list[TurnRecord], ScriptedServer]:
    server = ScriptedServer(unknown)

    async def main() -> list[TurnRecord]:
        async with websockets.serve(server.handle, "127.0.0.1", 0) as ws_server:
            port = next(iter(ws_server.sockets)).getsockname()[1]
            cfg = RealtimeLoadConfig(
                url=f"ws://127.0.0.1:{port}/v1/realtime", speech=SPEECH, turns=2, gap_s=0.05,
                audio_frames=8, max_output_tokens=4, speculative=speculative, turn_timeout_s=10,
            )  # fmt: skip
            records, _ = await run_realtime_load(cfg, lambda r: None)
            return records

    return asyncio.run(main()), server


def test_a_server_without_the_speculative_extension_is_driven_with_it_off() -> None:
    records, server = _run(frozenset({"speculative_response"}), speculative=False)
    assert [(r.turn, r.ok) for r in records] == [(0, True), (1, True)]
    assert all(r.first_audio is not None and r.first_audio > r.speech_end for r in records)
    # sent again without the key, the rest of the extension kept
    assert server.accepted == [
        {
            "type": "realtime",
            "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 500}}},
            "max_output_tokens": 4,
            "omnivoice": {"output_audio_frames": 8, "min_output_tokens": 4},
        }
    ]
    assert server.appends_before_update == 0


def test_a_server_that_knows_the_extension_gets_it() -> None:
    records, server = _run(frozenset(), speculative=False)
    assert [r.ok for r in records] == [True, True]
    assert [s["omnivoice"]["speculative_response"] for s in server.accepted] == [False]


def test_speculation_asked_on_from_a_server_without_it_fails_the_session_unmeasured() -> None:
    records, server = _run(frozenset({"speculative_response"}), speculative=True)
    assert len(records) == 1 and records[0].turn == -1 and not records[0].ok
    assert records[0].error is not None and SPECULATIVE_PARAM in records[0].error
    assert server.accepted == [] and server.appends_before_update == 0


def test_any_other_refused_update_fails_the_session_before_it_speaks() -> None:
    records, server = _run(frozenset({"output_audio_frames"}), speculative=False)
    assert len(records) == 1 and records[0].turn == -1
    assert records[0].error is not None and "session.omnivoice.output_audio_frames" in records[0].error
    assert server.accepted == [] and server.appends_before_update == 0


def test_bad_options_exit_2(capsys) -> None:
    for bad in (["--sessions", "0"], ["--turn-timeout-s", "0"]):
        assert main(["bench", "realtime", *bad]) == 2
    err = capsys.readouterr().err
    assert "--sessions" in err and "--turn-timeout-s > 0" in err
