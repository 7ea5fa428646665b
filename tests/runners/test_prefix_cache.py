"""The thinker's prefix cache: later turns prefill only what is new, with the same output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from omnivoice.config import parse_profile
from omnivoice.engine.engine import Engine
from omnivoice.runners.prefix_cache import PrefixCache, PrefixEntry, common_prefix, position_keys
from omnivoice.types import AudioPart, ChatMessage, GenerationRequest, Prompt, Sampling, TextPart
from tests.support.engine import audio_of, collect, tokens_of
from tests.support.polling import until

PAD = 9


def test_position_keys_tell_different_audio_apart() -> None:
    a = np.ones((4, 10), np.float32)
    b = np.zeros((4, 10), np.float32)
    ids = (1, PAD, PAD, 2, PAD, 3)
    same = position_keys(Prompt(ids, (a, b)), PAD)
    other = position_keys(Prompt(ids, (a, a)), PAD)
    assert same[:4] == other[:4]
    assert common_prefix(same, other) == 4
    assert same[1] == ("audio", same[1][1], 0) and same[2][2] == 1


def test_cache_is_lru_and_releases_slots() -> None:
    released: list[int] = []
    cache = PrefixCache(2, released.append)
    for i, key in enumerate(["a", "b", "c"]):
        cache.put(key, PrefixEntry(i, [1, 2], None, None))  # type: ignore[arg-type]
    assert released == [0] and len(cache) == 2
    entry, n = cache.match("b", [1, 2, 3])
    assert entry is not None and n == 2
    cache.put("d", PrefixEntry(3, [], None, None))  # type: ignore[arg-type]
    assert released == [0, 2], "c was the least recently used"
    assert cache.take("b") == 1 and len(cache) == 1
    cache.drop("d")
    assert released == [0, 2, 3]


def _profile(checkpoint: Path, entries: int, overlap: bool = False):
    stage = {"worker": "thread", "max_seq_len": 1024, "max_batch": 4, "overlap": overlap}
    return parse_profile(
        {
            "model": {"path": str(checkpoint)},
            "stages": {
                "thinker": {**stage, "prefix_cache_entries": entries},
                "talker": stage,
                # chunks keep their sizes: where they end must not depend on the machine's speed
                "code2wav": {**stage, "chunk": {"catch_up": False}},
            },
        }
    )


def _speech(seed: int) -> AudioPart:
    rng = np.random.default_rng(seed)
    return AudioPart((0.1 * rng.standard_normal(20000)).astype(np.float32), 16000)


def _req(engine: Engine, rid: str, messages: list[ChatMessage], key: str | None) -> GenerationRequest:
    return GenerationRequest(
        rid,
        engine.build_prompt(messages),
        thinker=Sampling(max_tokens=12, min_tokens=12),
        talker=Sampling(max_tokens=30, min_tokens=30, repetition_penalty=1.05),
        cache_key=key,
    )


async def _conversation(engine: Engine, key: str | None, warm: bool) -> list[tuple[list, str]]:
    history = [
        ChatMessage("system", (TextPart("be brief"),)),
        ChatMessage("user", (_speech(1), TextPart("hi"))),
    ]
    outs1, _ = await collect(engine, _req(engine, "t1", history, key))
    text1 = "".join(o.text for o in outs1 if hasattr(o, "text"))
    history += [ChatMessage("assistant", (TextPart(text1),))]
    if warm and key:
        await engine.warm(engine.build_prompt(history), key)  # the user is still speaking
    history += [ChatMessage("user", (_speech(2), TextPart("and then?")))]
    outs2, _ = await collect(engine, _req(engine, "t2", history, key))
    return [(outs1, text1), (outs2, "")]


# overlap: thinker and talker read each step back after queuing the next (the GPU default), so the
# cached prefix must leave out what a step queued past a request's end fed into its KV
@pytest.mark.parametrize("warm,overlap", [(False, False), (True, False), (True, True)])
async def test_cached_turns_match_uncached_turns(tiny_checkpoint: Path, warm: bool, overlap: bool) -> None:
    plain = await Engine.start(_profile(tiny_checkpoint, 0))
    try:
        expected = await _conversation(plain, None, warm=False)
    finally:
        await plain.close()
    cached = await Engine.start(_profile(tiny_checkpoint, 4, overlap))
    try:
        got = await _conversation(cached, "session-1", warm=warm)

        def reused() -> bool:  # at least the system prompt, the first user turn and most of the answer
            thinker = next(s for s in cached.stats().stages if s.name == "thinker")
            return thinker.cached_tokens > 20

        await until(reused, what="the second turn reusing the first one's cached prefix")
        cached.forget("session-1")
    finally:
        await cached.close()
    for (e_outs, _), (g_outs, _) in zip(expected, got, strict=True):
        assert tokens_of(g_outs) == tokens_of(e_outs)
        np.testing.assert_allclose(audio_of(g_outs), audio_of(e_outs), rtol=0, atol=1e-4)
