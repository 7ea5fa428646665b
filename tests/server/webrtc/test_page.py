"""The voice-chat page in real headless Chromium (Debian's `chromium`, driven by Playwright over the
DevTools protocol), its microphone faked from an espeak-ng WAV: in WebRTC mode and in WebSocket mode
the page connects with a client secret, the server detects the spoken turn, the assistant's audio
comes back, and the page shows the transcript and the turn's latency.

Set OMNIVOICE_SCREENSHOTS=docs to refresh the committed screenshots (docs/page-*.png).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from ..serve import ServerThread
from .common import fixed, serve_tiny, speech_wav

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
# How the machine's notes say headless Chromium runs here (closed network, root, fresh profile), plus
# the fake microphone (the WAV once, then silence) and autoplay for the assistant's audio.
FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--use-fake-device-for-media-stream",
    "--use-fake-ui-for-media-stream", "--autoplay-policy=no-user-gesture-required",
    "--disable-features=WebRtcHideLocalIpsWithMdns",  # plain host candidates: no mDNS to resolve
]  # fmt: skip
TIMEOUT_MS = 60_000


@pytest.fixture(scope="module")
def playwright() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (apt-get install chromium; .ci/run does)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def server(tiny_checkpoint: Path) -> Iterator[ServerThread]:
    with serve_tiny(tiny_checkpoint) as st:
        yield st


@pytest.fixture(scope="module")
def microphone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 1 s of silence while the page connects, the question, then silence that ends the turn
    text = "Hello there. Could you tell me a short story about the sea?"
    return speech_wav(text, tmp_path_factory.mktemp("mic"), lead_s=1.0, tail_s=2.0)


def screenshot(page: Any, name: str, tmp_path: Path) -> None:
    page.screenshot(path=str(tmp_path / name), full_page=True)
    target = os.environ.get("OMNIVOICE_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp_path / name, Path(target) / name)


@pytest.mark.parametrize("mode", ["webrtc", "websocket"])
def test_page_voice_turn(
    mode: str, playwright: Any, server: ServerThread, microphone: Path, tmp_path: Path
) -> None:
    args = [*FLAGS, f"--use-file-for-fake-audio-capture={microphone}%noloop"]
    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=args, headless=True)
    try:
        page = browser.new_page(viewport={"width": 1100, "height": 860})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        session = quote(json.dumps(fixed(12, 25)))  # 2 s of the random model's audio
        page.goto(f"{server.base_url}/?mode={mode}&session={session}")
        page.wait_for_function("window.omnivoice && window.omnivoice.ready")
        page.click("#talk")
        page.wait_for_function("window.omnivoice.state !== 'connecting'", timeout=TIMEOUT_MS)
        # the server detects the turn; the first audio back gives the turn's latency
        page.wait_for_function("window.omnivoice.latencies.length >= 1", timeout=TIMEOUT_MS)
        page.wait_for_timeout(400)  # let the meters and the transcript catch up, for the screenshot
        screenshot(page, f"page-{mode}.png", tmp_path)
        done = "output_audio_buffer.stopped" if mode == "webrtc" else "response.done"
        page.wait_for_function(f"window.omnivoice.events.includes('{done}')", timeout=TIMEOUT_MS)
        page.wait_for_function("window.omnivoice.audioReceivedMs > 1500", timeout=10_000)
        state = page.evaluate("window.omnivoice")
        latency_text = page.text_content("#latency-last") or ""
        reply = page.text_content("#transcript li.assistant .text") or ""
        if mode == "websocket":
            page.set_viewport_size({"width": 390, "height": 844})  # a phone
            screenshot(page, "page-mobile.png", tmp_path)
        page.click("#talk")  # hang up
        page.wait_for_function("window.omnivoice.state === 'idle'", timeout=10_000)
        wait_released(server)
    finally:
        browser.close()
    assert not errors and not state["errors"], (errors, state["errors"])
    assert state["turns"] == 1
    assert state["events"].index("input_audio_buffer.speech_stopped") < state["events"].index("response.done")
    if mode == "webrtc":
        assert "response.output_audio.delta" not in state["events"]  # the audio came on the track
        assert state["audioEnergy"] > 0  # and it was not silence
    else:
        assert "response.output_audio.delta" in state["events"]
    assert 1500 < state["audioReceivedMs"] < 3000  # 25 frames of 80 ms
    [latency] = state["latencies"]
    assert 0 < latency < 10_000 and re.fullmatch(rf"{latency} ms", latency_text.strip())
    assert reply.strip()  # the transcript shows the reply's text (noise: random weights)


def wait_released(server: ServerThread, timeout: float = 10.0) -> None:
    state = server.server.config.app.state
    deadline = time.monotonic() + timeout
    while state.webrtc.calls or state.realtime.sessions:
        assert time.monotonic() < deadline, (state.webrtc.calls, state.realtime.sessions)
        time.sleep(0.05)
