"""The voice-chat page in real headless Chromium (Debian's `chromium`, driven by Playwright over the
DevTools protocol), its microphone faked from an espeak-ng WAV: in WebRTC mode and in WebSocket mode
the page connects with a client secret, the server detects the spoken turn, the assistant's audio
comes back, and the page shows the transcript (the caller's words as the server's model wrote them
down, and the replies) and the turn's latency. The WAV then speaks over the reply: the barge-in stops
the playout (server-side over WebRTC, in the page over WebSocket) and the next turn is answered.
Camera frames from Chromium's fake camera reach the server's conversation as `input_image` parts and
show as thumbnails; a refused camera is said on the page.

Set OMNIVOICE_SCREENSHOTS=docs to refresh the committed screenshots (docs/page-*.png).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.support.keys import KEY, serve_keyed
from tests.support.polling import wait_until
from tests.support.serve import ServerThread, serve_tiny
from tests.support.speech import fixed, speech_wav

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
    with serve_tiny(tiny_checkpoint, realtime={"transcription_max_tokens": 12}) as st:
        yield st


@pytest.fixture(scope="module")
def microphone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # silence while the page connects, a question, silence that ends the turn while the reply starts
    # playing, then an interruption over the reply, and silence
    question = "Hello there. Could you tell me a short story about the sea?"
    parts: list[str | float] = [1.0, question, 2.5, "Wait, stop, stop please.", 2.0]
    return speech_wav(parts, tmp_path_factory.mktemp("mic"))


def screenshot(page: Any, name: str, tmp_path: Path) -> None:
    page.screenshot(path=str(tmp_path / name), full_page=True)
    target = os.environ.get("OMNIVOICE_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp_path / name, Path(target) / name)


@pytest.mark.parametrize("mode", ["webrtc", "websocket"])
def test_page_voice_turns_and_barge_in(
    mode: str, playwright: Any, server: ServerThread, microphone: Path, tmp_path: Path
) -> None:
    args = [*FLAGS, f"--use-file-for-fake-audio-capture={microphone}%noloop"]
    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=args, headless=True)
    try:
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        session = quote(json.dumps(fixed(24, 150)))  # 12 s of the random model's audio: still playing
        page.goto(f"{server.base_url}/?mode={mode}&session={session}")
        page.wait_for_function("window.omnivoice && window.omnivoice.ready")
        page.click("#talk")
        # the server detects the turn; the first audio back gives the turn's latency
        page.wait_for_function("window.omnivoice.latencies.length >= 1", timeout=TIMEOUT_MS)
        page.wait_for_function("window.omnivoice.audioReceivedMs > 500", timeout=TIMEOUT_MS)
        first = page.evaluate("window.omnivoice")
        # the interruption: the reply stops, the next turn is answered
        page.wait_for_function("window.omnivoice.latencies.length >= 2", timeout=TIMEOUT_MS)
        completed = "conversation.item.input_audio_transcription.completed"
        transcribed = f"window.omnivoice.events.filter((t) => t === '{completed}').length >= 2"
        page.wait_for_function(transcribed, timeout=TIMEOUT_MS)
        (session,) = server.server.config.app.state.realtime.sessions.values()
        heard = {i.id: i.content[0].transcript for i in session.conversation.items if i.role == "user"}
        page.wait_for_timeout(500)  # the meters and the transcript catch up, for the screenshot
        screenshot(page, f"page-{mode}.png", tmp_path)
        if mode == "websocket":
            page.set_viewport_size({"width": 390, "height": 844})  # a phone
            screenshot(page, "page-mobile.png", tmp_path)
        state = page.evaluate("window.omnivoice")
        latency_text = page.text_content("#latency-last") or ""
        replies = page.locator("#transcript li.assistant").all_text_contents()
        said = page.locator("#transcript li.user .text").all_text_contents()
        page.click("#talk")  # hang up
        page.wait_for_function("window.omnivoice.state === 'idle'", timeout=10_000)
        wait_until(lambda: released(server), 10, "the call released")
    finally:
        browser.close()
    assert not errors and not state["errors"], (errors, state["errors"])
    events = state["events"]
    assert state["turns"] == 2 and events.count("input_audio_buffer.speech_started") == 2
    assert events.index("input_audio_buffer.speech_stopped") < events.index("response.created")
    assert first["audioEnergy"] > 0 if mode == "webrtc" else first["audioReceivedMs"] > 500
    if mode == "webrtc":  # the audio came on the track; the server cleared its playout at the barge-in
        assert "response.output_audio.delta" not in events
        assert "output_audio_buffer.started" in events and "output_audio_buffer.cleared" in events
    else:  # the page played the deltas, stopped at the barge-in and said how much was heard
        assert "response.output_audio.delta" in events
        assert events.count("conversation.item.truncated") == state["truncates"] == 1
    assert "interrupted" in replies[0]  # the first reply was cut off by the barge-in
    assert all(0 < ms < 10_000 for ms in state["latencies"])
    assert re.fullmatch(rf"{state['latencies'][-1]} ms", latency_text.strip())
    assert len(replies) == 2 and all(r.strip() for r in replies)  # the transcript shows both replies
    # the caller's turns show what the server's model wrote down, in place of "(spoken, 4.0 s)"
    users = [e for e in state["transcript"] if e["role"] == "user"]
    assert len(users) == 2 and all(heard[e["itemId"]] and e["text"] == heard[e["itemId"]] for e in users)
    assert said == [e["text"] for e in users]


def released(server: ServerThread) -> bool:
    state = server.server.config.app.state
    return not state.webrtc.calls and not state.realtime.sessions


@pytest.mark.parametrize("mode", ["websocket", "webrtc"])
def test_page_on_a_server_with_api_keys(mode: str, playwright: Any) -> None:
    """The page asks for the key when the server answers 401, keeps it in localStorage, mints a
    client secret with it and opens the session with the secret."""
    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
    try:
        with serve_keyed() as srv:
            page = browser.new_page()
            page.goto(f"{srv.url}/?mode={mode}")
            page.wait_for_function("window.omnivoice && window.omnivoice.ready")
            assert page.is_hidden("#key-row")  # nothing asks for a key until the server does
            page.click("#talk")
            page.wait_for_function("window.omnivoice.state === 'failed'", timeout=TIMEOUT_MS)
            assert page.is_visible("#key-row")
            assert "needs an API key" in page.evaluate("window.omnivoice.errors")[-1]["message"]
            # the reason is shown beside the key field, not only in the (collapsed) events log
            assert "needs an API key" in (page.text_content("#key-error") or "")
            page.fill("#api-key", "sk-wrong")
            assert page.is_hidden("#key-error")  # a new key: the old reason is gone
            page.click("#talk")
            page.wait_for_function("window.omnivoice.state === 'failed'", timeout=TIMEOUT_MS)
            assert page.is_visible("#key-error") and "refused" in (page.text_content("#key-error") or "")
            page.fill("#api-key", KEY)
            page.click("#talk")
            connected = "window.omnivoice.state === 'connected'"
            page.wait_for_function(
                f"window.omnivoice.events.includes('session.created') && {connected}", timeout=TIMEOUT_MS
            )
            assert srv.app.state.realtime.sessions and page.is_hidden("#key-error")
            assert log_markers_fit(page)
            page.click("#talk")  # hang up
            page.wait_for_function("window.omnivoice.state === 'idle'", timeout=10_000)
            page.reload()  # the key is remembered
            page.wait_for_function("window.omnivoice && window.omnivoice.ready")
            assert page.is_visible("#key-row") and page.input_value("#api-key") == KEY
    finally:
        browser.close()


# Records the camera streams the page opens (to see it reuse one and stop it at the call's end).
RECORD_CAMERA = """
    const open = navigator.mediaDevices.getUserMedia.bind(navigator.mediaDevices);
    window.cameraStreams = [];
    navigator.mediaDevices.getUserMedia = async (constraints) => {
        const stream = await open(constraints);
        if (constraints && constraints.video) window.cameraStreams.push(stream);
        return stream;
    };
"""
# The camera refused, as a browser does when its user says no (the microphone still works).
REFUSE_CAMERA = """
    const open = navigator.mediaDevices.getUserMedia.bind(navigator.mediaDevices);
    navigator.mediaDevices.getUserMedia = (constraints) => constraints && constraints.video
        ? Promise.reject(new DOMException("Permission denied", "NotAllowedError"))
        : open(constraints);
"""
CONNECTED = "window.omnivoice.state === 'connected' && window.omnivoice.events.includes('session.created')"


@pytest.fixture(scope="module")
def silence(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return speech_wav([2.0], tmp_path_factory.mktemp("silence"))


@pytest.mark.parametrize("mode", ["websocket", "webrtc"])
def test_page_shares_camera_frames(
    mode: str, playwright: Any, server: ServerThread, silence: Path, tmp_path: Path
) -> None:
    """With Chromium's fake camera, "Share camera frame" sends a frame as a user item with an
    `input_image` part (a JPEG data URL, its longer side at most 1024 px) over the page's transport and
    shows its thumbnail; a second frame reuses the camera, which stops when the call ends."""
    args = [*FLAGS, f"--use-file-for-fake-audio-capture={silence}%noloop"]
    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=args, headless=True)
    try:
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.add_init_script(RECORD_CAMERA)
        page.goto(f"{server.base_url}/?mode={mode}")
        page.wait_for_function("window.omnivoice && window.omnivoice.ready")
        assert page.is_disabled("#camera")  # not connected
        page.click("#talk")
        page.wait_for_function(CONNECTED, timeout=TIMEOUT_MS)
        for n in (1, 2):
            page.click("#camera")
            added = f"window.omnivoice.frames.filter((f) => f.status === 'added').length === {n}"
            page.wait_for_function(added, timeout=TIMEOUT_MS)
        (session,) = server.server.config.app.state.realtime.sessions.values()
        images = {i.id: c for i in session.conversation.items if i.role == "user" for c in i.content}
        state = page.evaluate("window.omnivoice")
        thumbnails = [img.get_attribute("src") for img in page.locator("#transcript li.user.frame img").all()]
        log = page.locator("#log li").all_text_contents()
        message = page.text_content("#camera-error")
        if mode == "websocket":
            screenshot(page, "page-camera.png", tmp_path)
        page.click("#talk")  # hang up
        page.wait_for_function("window.omnivoice.state === 'idle'", timeout=10_000)
        assert page.is_disabled("#camera")
        tracks = page.evaluate("window.cameraStreams.flatMap((s) => s.getTracks().map((t) => t.readyState))")
        wait_until(lambda: released(server), 10, "the call released")
    finally:
        browser.close()
    assert not errors and not state["errors"] and not message, (errors, state["errors"], message)
    assert tracks == ["ended"]  # one camera for both frames, stopped with the call
    frames = state["frames"]
    assert [images[f["itemId"]].type for f in frames] == ["input_image", "input_image"]
    assert thumbnails == [images[f["itemId"]].image_url for f in frames]
    for f in frames:
        image = images[f["itemId"]]
        assert image.image_url.startswith("data:image/jpeg;base64,") and image.image is not None
        assert image.image.shape == (f["height"], f["width"]) and 0 < max(f["width"], f["height"]) <= 1024
    assert sum("camera frame sent" in line for line in log) == 2
    assert state["events"].count("conversation.item.added") == 2


def test_page_says_when_the_camera_is_refused(playwright: Any, server: ServerThread, silence: Path) -> None:
    """A refused camera is said on the page, beside the button; the call goes on."""
    args = [*FLAGS, f"--use-file-for-fake-audio-capture={silence}%noloop"]
    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=args, headless=True)
    try:
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.add_init_script(REFUSE_CAMERA)
        page.goto(f"{server.base_url}/?mode=websocket")
        page.wait_for_function("window.omnivoice && window.omnivoice.ready")
        page.click("#talk")
        page.wait_for_function(CONNECTED, timeout=TIMEOUT_MS)
        page.click("#camera")
        page.wait_for_selector("#camera-error:not(:empty)", timeout=TIMEOUT_MS)
        message = page.text_content("#camera-error") or ""
        visible = page.is_visible("#camera-error")
        state = page.evaluate("window.omnivoice")
        thumbnails = page.locator("#transcript li.frame").count()
        enabled = page.is_enabled("#camera")  # the user may allow it and try again
        page.click("#talk")  # hang up
        page.wait_for_function("window.omnivoice.state === 'idle'", timeout=10_000)
        wait_until(lambda: released(server), 10, "the call released")
    finally:
        browser.close()
    assert visible and "camera was refused" in message
    assert not errors and state["state"] == "connected" and enabled
    assert not state["frames"] and thumbnails == 0


def log_markers_fit(page: Any) -> bool:
    """The Events log leaves room left of its entries for the widest number it shows ("300.")."""
    return bool(
        page.evaluate(
            """() => {
                const list = document.getElementById("log");
                const probe = document.createElement("span");
                probe.textContent = "300.";
                probe.style.whiteSpace = "pre";
                list.append(probe);
                const width = probe.getBoundingClientRect().width;
                probe.remove();
                return parseFloat(getComputedStyle(list).paddingLeft) >= width;
            }"""
        )
    )
