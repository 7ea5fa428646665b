"""First audio first, through the whole engine: a request that arrives while others stream far ahead of
playback gets its first audio before they get more.

The watermarks are set so that every stream playing counts as AHEAD however fast this machine makes
audio, and Code2Wav decodes one chunk per step, so arrival order would keep serving the older streams'
chunks first. Giving way is left unbounded here (`max_yield_ms`), so what is checked is the order of
events, not a race: the older streams get no audio from a moment after the new request is sent until
its first audio has come (a step already under way when it arrived may still finish).
"""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from pathlib import Path

from omnivoice.config import Profile
from omnivoice.engine.engine import Engine
from omnivoice.types import AudioChunk, GenerationRequest
from tests.support.engine import profile_for, request, started
from tests.support.polling import until

OLD_FRAMES = 400  # 32 s of audio: the older streams are still going when the new one arrives


def _profile(checkpoint: Path) -> Profile:
    return profile_for(
        checkpoint,
        code2wav={
            "max_batch": 1,
            "chunk": {"first_frames": 1, "frames": 1, "left_context": 2, "ramp": False},
        },
        priority={
            # AHEAD unless an hour behind real time: every stream that has started
            "low_watermark_s": -3601.0,
            "high_watermark_s": -3600.0,
            "max_yield_ms": 600_000,
        },
    )


async def _stream(engine: Engine, req: GenerationRequest, events: list[str]) -> None:
    async with aclosing(engine.generate(req)) as outs:
        async for out in outs:
            if isinstance(out, AudioChunk):
                events.append(req.request_id)


async def _arrival(engine: Engine) -> list[str]:
    """Three long streams, then a new request once all are playing: the audio events (request ids)
    from the new request's arrival to its first audio."""
    old = [request(engine, i, thinker_tokens=8, audio_frames=OLD_FRAMES) for i in (0, 2, 0)]
    events: list[str] = []
    tasks = [asyncio.create_task(_stream(engine, r, events)) for r in old]
    try:
        await until(lambda: all(events.count(r.request_id) >= 2 for r in old), 60, what="the streams")
        new = request(engine, 1, thinker_tokens=8, audio_frames=8)
        mark = len(events)
        tasks.append(asyncio.create_task(_stream(engine, new, events)))
        await until(lambda: new.request_id in events[mark:], 60, what="the new request's first audio")
        return events[mark : events.index(new.request_id, mark) + 1]
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_new_request_gets_its_first_audio_before_streams_ahead_get_more(
    tiny_checkpoint: Path,
) -> None:
    async with started(_profile(tiny_checkpoint)) as engine:
        events = await _arrival(engine)
    # Only what was under way when the request arrived: the chunk Code2Wav (one per step) was
    # decoding, those already on their way to the caller, one a stage stepped before it saw the new
    # request on the board (the new audio itself is the last event). In arrival order the three older
    # streams get a chunk for every frame the talker makes for the new request: a dozen or more.
    assert len(events) <= 5, events
