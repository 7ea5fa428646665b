"""The engine client refuses what its core would, from the core's snapshots: a core whose start
narrowed it (`Engine.narrow`) holds fewer requests than the profile's widths, and the client's own
check follows it, so a streaming response is refused before its 200, not failed after it."""

from __future__ import annotations

from pathlib import Path

from omnivoice.config import parse_profile
from omnivoice.engine.core.client import EngineClient
from omnivoice.engine.loading import load_served_model
from omnivoice.engine.start_progress import StartProgress
from omnivoice.messages import CoreSnapshot
from omnivoice.types import EngineStats, GenerationRequest, Prompt, Sampling

STAGE = {"worker": "thread", "max_batch": 4, "max_queue": 2, "max_seq_len": 256}


def test_the_client_holds_no_more_than_a_narrowed_core_serves(tiny_checkpoint: Path) -> None:
    stages = {"core": "process", "thinker": STAGE, "talker": STAGE, "code2wav": STAGE}
    profile = parse_profile({"model": {"path": str(tiny_checkpoint)}, "stages": stages})
    client = EngineClient(profile, load_served_model(profile), StartProgress())
    audio = GenerationRequest("a", Prompt(input_ids=(10, 11)), talker=Sampling(max_tokens=4))
    try:
        client._load = [2, 2]  # two requests with audio in flight
        assert client.overloaded(audio) is None  # the profile's widths: 4 running + 2 waiting
        client._on_message(None, CoreSnapshot(EngineStats((), 2, narrowed=2), (), None, False))  # type: ignore[arg-type]
        why = client.overloaded(audio)
        assert why == "the server is at capacity: its GPU memory allows 2 requests at a time; retry shortly"
        client._on_message(None, CoreSnapshot(EngineStats((), 2), (), None, False))  # type: ignore[arg-type]
        assert client.overloaded(audio) is None  # a later core that was not narrowed
    finally:
        client._grammars.close()
