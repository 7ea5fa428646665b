"""A request's first audio chunk says where its wait went, stage by stage."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from omnivoice.types import AudioChunk, FirstAudio
from tests.support.engine import profile_for, request, started


@pytest.mark.parametrize("worker", ["thread", "process"])
async def test_the_first_chunk_breaks_its_wait_down_and_the_parts_add_up(
    tiny_checkpoint: Path, worker: str
) -> None:
    async with started(profile_for(tiny_checkpoint, worker=worker)) as eng:
        req = request(eng, 0)
        began = time.monotonic()
        chunks: list[AudioChunk] = []
        waited_ms = None
        async for out in eng.generate(req):
            if isinstance(out, AudioChunk):
                if not chunks:
                    waited_ms = 1e3 * (time.monotonic() - began)
                chunks.append(out)
    first = chunks[0].first_audio
    assert isinstance(first, FirstAudio)
    assert all(c.first_audio is None for c in chunks[1:])
    parts = [
        first.to_first_token_ms,
        first.to_talker_ms,
        first.talker_frames_ms,
        first.to_code2wav_ms,
        first.decode_ms,
        first.to_engine_ms,
    ]
    # the talker may take its first text a little before the engine sees the token: that part only
    # can come out below zero
    assert first.to_talker_ms > -50
    others = [first.to_first_token_ms, first.talker_frames_ms, first.to_code2wav_ms, first.decode_ms]
    assert min([*others, first.to_engine_ms]) >= 0
    assert first.talker_frames_ms > 0 and first.decode_ms > 0
    assert waited_ms is not None
    assert sum(parts) == pytest.approx(waited_ms, abs=50)  # the same clock, seen from the engine
