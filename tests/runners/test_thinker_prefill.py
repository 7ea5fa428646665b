"""The thinker's batched prefill keeps within its KV slots: a turn on top of a long cached prefix and a
long new prompt, each fitting a slot alone, are prefilled in the same step and both answered, with the
tokens each gets alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omnivoice.messages import NewRequest, StageFinished, TokenOutput
from omnivoice.models.dummy import NEWLINE_ID
from omnivoice.runners.factory import build_runners
from omnivoice.types import GenerationRequest, Prompt, Sampling
from tests.support.engine import profile_for

SEQ = 128  # the thinker's KV slot length
LONG = 90  # a cached conversation's length, and a new prompt's: together past SEQ, each alone within it


@pytest.fixture(scope="module")
def thinker(tiny_checkpoint: Path):
    greedy = {"device": "cpu", "prefix_cache_entries": 2, "sampling": {"temperature": 0.0}}
    profile = profile_for(tiny_checkpoint, max_seq_len=SEQ, thinker=greedy, talker={"device": "cpu"})
    return build_runners(profile, tiny_checkpoint, only=(("thinker", 0),))[("thinker", 0)]


def _request(rid: str, ids: list[int], key: str | None = None, warm: bool = False) -> GenerationRequest:
    return GenerationRequest(
        rid,
        Prompt(tuple(ids)),
        want_audio=False,
        thinker=Sampling(max_tokens=8, min_tokens=8, temperature=0.0),
        cache_key=key,
        prefill_only=warm,
    )


def _run(thinker, requests: list[GenerationRequest]) -> tuple[dict[str, list[int]], set[str], int]:
    """Accept `requests` at once, step to the end: each one's tokens, those that finished, and the
    largest number of requests one step prefilled."""
    for r in requests:
        thinker.accept(NewRequest(r))
    tokens: dict[str, list[int]] = {}
    finished: set[str] = set()
    widest = 0
    while thinker.has_work():
        waiting = len(thinker.waiting)
        for out in thinker.step():
            if isinstance(out, TokenOutput):
                tokens.setdefault(out.request_id, []).extend(out.token_ids)
            elif isinstance(out, StageFinished):
                finished.add(out.request_id)
        widest = max(widest, waiting - len(thinker.waiting))
    return tokens, finished, widest


def test_a_cached_turn_and_a_long_prompt_prefill_together_within_the_slots(thinker) -> None:
    conversation = [NEWLINE_ID + 1 + i % 50 for i in range(LONG)]
    turn = conversation + [NEWLINE_ID + 2] * 6  # on top of the cached prefix: few new positions
    other = [NEWLINE_ID + 3 + i % 40 for i in range(LONG)]  # no cached prefix: all new

    alone_other, _, _ = _run(thinker, [_request("other-alone", other)])
    _run(thinker, [_request("warm-alone", conversation, "a", warm=True)])
    alone_turn, _, _ = _run(thinker, [_request("turn-alone", turn, "a")])

    _run(thinker, [_request("warm", conversation, "b", warm=True)])
    tokens, finished, widest = _run(thinker, [_request("turn", turn, "b"), _request("other", other)])

    assert widest == 2, "both were admitted to the same step's prefill"
    assert {"turn", "other"} <= finished
    assert tokens["turn"] == alone_turn["turn-alone"]
    assert tokens["other"] == alone_other["other-alone"]
    assert thinker.stats().cached_tokens >= 2 * LONG - 2, "both turns reused their conversation's prefix"
    # each prompt position was either taken from a cached prefix or computed, never both nor neither
    stats, prompts = thinker.stats(), [other, conversation, turn, conversation, turn, other]
    assert stats.cached_tokens + stats.prefilled_tokens == sum(len(p) for p in prompts)


def _tokens(outs: list, into: dict[str, list[int]]) -> None:
    for out in outs:
        if isinstance(out, TokenOutput):
            into.setdefault(out.request_id, []).extend(out.token_ids)


def _fail_prompts(module: torch.nn.Module):
    """A fault in `module` whenever it takes more than one position (a prompt, not a decode step)."""

    def hook(mod, args):
        if args[0].shape[1] > 1:
            raise RuntimeError("injected prefill fault")

    return module.register_forward_pre_hook(hook)


# where the fault strikes: in the batch's forward (both new requests admitted), or while the first of
# them is admitted (its embeddings: the second is still waiting)
@pytest.mark.parametrize("where", ["forward", "admission"])
def test_a_failed_prefill_fails_its_batch_not_the_running_rows(thinker, where: str) -> None:
    first = [NEWLINE_ID + 1 + i % 30 for i in range(40)]
    alone, _, _ = _run(thinker, [_request("alone", first)])
    slots = thinker.cache.free_slots + len(thinker.prefix)

    got: dict[str, list[int]] = {}
    thinker.accept(NewRequest(_request("running", first)))
    _tokens(thinker.step(), got)
    assert "running" in thinker.running
    module = thinker.stack.layers[0].mlp if where == "forward" else thinker.embed
    hook = _fail_prompts(module)
    try:
        for rid, n in (("new-1", 30), ("new-2", 50)):
            thinker.accept(NewRequest(_request(rid, [NEWLINE_ID + 2 + i % 20 for i in range(n)])))
        with pytest.raises(RuntimeError, match="injected prefill fault"):
            thinker.step()
        failed = thinker.active_ids()
        for rid in failed:  # as the stage fails the step's requests
            thinker.abort(rid)
    finally:
        hook.remove()
    assert failed == (["new-1", "new-2"] if where == "forward" else ["new-1"])
    assert "running" in thinker.running
    assert thinker.cache.free_slots + len(thinker.prefix) == slots - 1, "only the running row holds one"

    while thinker.has_work():
        _tokens(thinker.step(), got)
    assert got["running"] == alone["alone"], "the running request went on as if nothing happened"
    assert ("new-2" in got) == (where == "admission"), "a request still waiting was not failed"
    assert thinker.cache.free_slots + len(thinker.prefix) == slots, "every slot came back"


def test_an_answer_cut_short_is_kept_as_a_turn_being_spoken_not_as_a_stored_answer(thinker) -> None:
    """A barged-in answer (or a speculative one its caller spoke past) comes back within seconds:
    with the cache full, a stored answer makes way for it, not the other way round."""
    keys = ("cut-a", "cut-b", "cut-c")
    while thinker.prefix.evict_one():  # what earlier tests left
        pass
    try:
        for i, key in enumerate(keys[:2]):  # two answers stored: the cache's two entries
            _run(thinker, [_request(f"cut-{i}", [NEWLINE_ID + 1 + i] * 20, key)])
        assert len(thinker.prefix) == 2
        thinker.accept(NewRequest(_request("cut-2", [NEWLINE_ID + 3] * 20, keys[2])))
        while "cut-2" not in thinker.running:
            thinker.step()
        thinker.step()
        thinker.abort("cut-2")  # the caller barged in
        assert thinker.prefix.match("cut-c", [])[0] is not None, "the cut answer was kept"
        assert thinker.prefix.match("cut-b", [])[0] is None, "the answer stored last made way"
        assert thinker.prefix.match("cut-a", [])[0] is not None
    finally:
        for key in keys:
            thinker.prefix.forget(key)
