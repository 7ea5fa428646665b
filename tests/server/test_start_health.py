"""`/health` while the real engine starts: the steps of the start, and, on a second start of the same
settings, how much of the first start's time remains."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx
import pytest

from omnivoice.server import create_app
from tests.support.engine import profile_for
from tests.support.polling import wait_until
from tests.support.serve import serve

pytestmark = pytest.mark.slow


def _start(profile: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Serve the tiny engine until it is up: `/health`'s progress at each poll while it started, and
    the start's progress once it is up."""
    app = create_app(profile)
    seen: list[dict[str, Any]] = []

    def ready() -> bool:
        body = httpx.get(f"{url}/health", timeout=10).json()
        if body["status"] == "starting":
            seen.append(body["progress"])
        return body["status"] == "ok"

    with serve(app, wait_healthy=None) as url:
        wait_until(ready, 240, "the engine ready")
        final = app.state.lifecycle.progress.snapshot()
    return seen, final


def test_health_reports_the_start_steps_and_a_second_start_expects_the_first_ones_time(
    tiny_checkpoint: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    profile = profile_for(tiny_checkpoint)
    model = profile.model.model_copy(update={"cache_dir": str(tmp_path)})  # no earlier start kept
    profile = profile.model_copy(update={"model": model})
    with caplog.at_level(logging.INFO, logger="omnivoice.engine.start_progress"):
        seen, final = _start(profile)
    assert seen, "/health never said the engine was starting"
    steps = [s["step"] for s in final["steps"]]
    # one thread builds every stage here: each stage's part of the weights is a step of its own
    loads = {"engine#0 load model", "engine#0 load thinker weights", "engine#0 load talker weights"}
    assert loads <= set(steps)
    assert all(s["state"] == "done" for s in final["steps"])
    for snap in seen:  # each poll: a part of the final list of steps, none expected on a first start
        assert {s["step"] for s in snap["steps"]} <= set(steps)
        assert snap["expected_s"] is None and all(s["expected_s"] is None for s in snap["steps"])
    assert [s["elapsed_s"] for s in seen] == sorted(s["elapsed_s"] for s in seen)
    assert "no earlier start of these settings" in caplog.text

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="omnivoice.engine.start_progress"):
        seen, final = _start(profile)
    assert "expected to take" in caplog.text and "of the expected start done" in caplog.text
    assert final["expected_s"] is not None and final["expected_s"] > 0
    assert all(s["expected_s"] is not None for s in final["steps"])
    assert seen and all(s["expected_s"] is not None for s in seen if s["steps"])
