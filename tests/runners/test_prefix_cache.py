"""The thinker's prefix cache: later turns prefill only what is new, with the same output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from omnivoice.config import parse_profile
from omnivoice.engine.engine import Engine
from omnivoice.runners.prefix_cache import PrefixCache, PrefixEntry, common_prefix, position_keys
from omnivoice.types import AudioPart, ChatMessage, Finished, GenerationRequest, Prompt, Sampling, TextPart
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


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _entry(slot: int) -> PrefixEntry:
    return PrefixEntry(slot, [1, 2], None, None)  # type: ignore[arg-type]


def _turn(cache: PrefixCache, key: str, slot: int) -> bool:
    """One turn of `key`'s conversation: its prompt looks up the cache, its answer is stored."""
    entry, _ = cache.match(key, [1, 2, 3])
    if entry is not None:
        cache.take(key)
    cache.put(key, _entry(slot))
    return entry is not None


def test_conversations_cycling_through_fewer_entries_keep_the_entries_they_have() -> None:
    """Eight sessions taking turns in order through four entries: least-recently-used eviction
    would drop each conversation just before its turn comes round; instead the answer stored last
    goes (its turn is the furthest off), and four of each round's eight turns find theirs."""
    clock, released = Clock(), list[int]()
    cache = PrefixCache(4, released.append, clock)
    sessions = [f"s{i}" for i in range(8)]
    hits = []
    for _ in range(5):
        found = 0
        for i, key in enumerate(sessions):
            clock.now += 3.0
            found += _turn(cache, key, i)
        hits.append(found)
    assert hits == [0, 4, 4, 4, 4]
    assert len(cache) == 4 and sorted(set(released)) == [4, 5, 6, 7] and len(released) == 5 * 4


def test_a_turn_still_being_spoken_is_kept_over_stored_answers() -> None:
    clock, released = Clock(), list[int]()
    cache = PrefixCache(2, released.append, clock)
    cache.put("a", _entry(0))
    clock.now = 1.0
    cache.put("b", _entry(1))
    clock.now = 2.0
    cache.put("c", _entry(2), answered=False)  # c's caller is speaking: its turn comes within seconds
    assert released == [1], "b's answer was stored last: its next turn is the furthest off"
    clock.now = 3.0
    cache.put("d", _entry(3), answered=False)
    assert released == [1, 0] and len(cache) == 2
    clock.now = 4.0
    cache.put("e", _entry(4), answered=False)  # only turns being spoken left: the least recently used
    assert released == [1, 0, 2]


def test_a_conversation_gone_quiet_goes_first() -> None:
    clock, released = Clock(), list[int]()
    cache = PrefixCache(3, released.append, clock)
    cache.put("quiet", _entry(0))
    for turn in range(4):  # two conversations come back 10 s after each answer
        for slot, key in ((1, "a"), (2, "b")):
            clock.now += 5.0
            assert _turn(cache, key, slot) == (turn > 0)
    assert cache.stale_after() == 30.0, "twice the usual 10 s, but not below the floor"
    assert clock.now > 30.0
    clock.now += 1.0
    cache.put("c", _entry(3))
    assert released[-1] == 0, "unused for longer than stale_after: its caller went quiet"
    clock.now += 1.0
    cache.put("d", _entry(4))
    assert released[-1] == 4, "then the answer stored last: d's own, the furthest from its next turn"


def test_a_forgotten_conversation_frees_its_slot_and_take_hands_one_over() -> None:
    released: list[int] = []
    cache = PrefixCache(2, released.append, Clock())
    cache.put("a", _entry(0))
    cache.put("b", _entry(1))
    entry, n = cache.match("a", [1, 2, 3])
    assert entry is not None and n == 2
    assert cache.take("a") == 0 and len(cache) == 1 and released == []
    cache.forget("b")
    assert released == [1] and len(cache) == 0
    assert not cache.evict_one()


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


async def _conversation(engine: Engine, key: str | None, warm: bool) -> list[tuple[list, Finished]]:
    history = [
        ChatMessage("system", (TextPart("be brief"),)),
        ChatMessage("user", (_speech(1), TextPart("hi"))),
    ]
    outs1, done1 = await collect(engine, _req(engine, "t1", history, key))
    text1 = "".join(o.text for o in outs1 if hasattr(o, "text"))
    history += [ChatMessage("assistant", (TextPart(text1),))]
    if warm and key:
        await engine.warm(engine.build_prompt(history), key)  # the user is still speaking
    history += [ChatMessage("user", (_speech(2), TextPart("and then?")))]
    outs2, done2 = await collect(engine, _req(engine, "t2", history, key))
    return [(outs1, done1), (outs2, done2)]


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
    for (e_outs, e_done), (g_outs, _) in zip(expected, got, strict=True):
        assert tokens_of(g_outs) == tokens_of(e_outs)
        assert e_done.usage.cached_tokens == 0  # no prefix cache
        np.testing.assert_allclose(audio_of(g_outs), audio_of(e_outs), rtol=0, atol=1e-4)
    # the second turn's usage counts what its prompt took from the cache
    first, second = (done.usage for _, done in got)
    assert first.cached_tokens == 0 and 20 < second.cached_tokens < second.prompt_tokens
