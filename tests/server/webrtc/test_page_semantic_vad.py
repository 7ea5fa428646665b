"""The voice-chat page with semantic VAD picked ("turn ends: when you sound done"), in WebRTC mode, in
headless Chromium with a fake microphone playing a complete espeak-ng question: the session the page
opens has semantic_vad, and the end-of-turn model, hearing the caller's Opus audio, ends the turn."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from omnivoice.audio import encode_wav
from tests.server.webrtc.test_page import CHROMIUM, FLAGS, TIMEOUT_MS, playwright, released
from tests.support.polling import wait_until
from tests.support.serve import ServerThread, serve_tiny
from tests.support.turn_clips import clip

pytestmark = pytest.mark.slow

__all__ = ["playwright"]  # the fixture, shared with the page's other tests


@pytest.fixture(scope="module")
def server(tiny_checkpoint: Path) -> Iterator[ServerThread]:
    with serve_tiny(tiny_checkpoint, realtime={"transcription_max_tokens": 12}) as st:
        yield st


@pytest.mark.parametrize("pick", ["select", "query"])
def test_page_offers_semantic_vad(pick: str, playwright: Any, server: ServerThread, tmp_path: Path) -> None:
    question = clip("complete/02.wav", 48000)  # "Please set an alarm for seven in the morning."
    mic = tmp_path / "mic.wav"
    silence = np.zeros(48000, np.float32)
    mic.write_bytes(encode_wav(np.concatenate([silence, question, silence, silence]), 48000))
    judge = server.server.config.app.state.realtime.judge.stats
    done_before = judge.done
    args = [*FLAGS, f"--use-file-for-fake-audio-capture={mic}%noloop"]
    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=args, headless=True)
    try:
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        query = "&turn=semantic_vad" if pick == "query" else ""  # auto
        page.goto(f"{server.base_url}/?mode=webrtc{query}")
        page.wait_for_function("window.omnivoice && window.omnivoice.ready")
        if pick == "select":
            page.select_option("#turn", "semantic_vad:auto")
        page.click("#talk")
        page.wait_for_function("window.omnivoice.latencies.length >= 1", timeout=TIMEOUT_MS)
        state = page.evaluate("window.omnivoice")
        (session,) = server.server.config.app.state.realtime.sessions.values()
        td = session.settings.turn_detection
        assert page.is_disabled("#turn")  # fixed for the call
        page.click("#talk")
        page.wait_for_function("window.omnivoice.state === 'idle'", timeout=10_000)
        wait_until(lambda: released(server), 10, "the call released")
    finally:
        browser.close()
    assert not errors and not state["errors"], (errors, state["errors"])
    assert td.type == "semantic_vad" and td.eagerness == "auto"
    assert state["turnDetection"]["type"] == "semantic_vad" and state["turnDetection"]["eagerness"] == "auto"
    assert state["turns"] == 1 and judge.done > done_before  # the model ended the turn
