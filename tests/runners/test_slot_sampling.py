"""SlotSampler (sampling state on the device, per KV slot) picks what sample_rows picks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnivoice.runners.graphs import StepGraphs
from omnivoice.runners.slot_sampling import SlotSampler, UniformDraws
from omnivoice.types import Sampling
from tests.support.host_sampling import RequestSampler, process_rows, sample_rows

VOCAB = 96
END = 5
SUPPRESS = torch.tensor([90, 91, 92])
PARAMS = [
    Sampling(repetition_penalty=1.3, min_tokens=4),  # greedy, penalized
    Sampling(temperature=0.7, top_k=4, seed=3),
    Sampling(temperature=0.9, top_k=50, repetition_penalty=1.05, seed=11),  # the talker's defaults
    Sampling(temperature=1.0, top_p=0.3, seed=4),
    Sampling(temperature=0.4, top_p=0.9, top_k=1, repetition_penalty=1.05),  # top-k 1: greedy
    Sampling(temperature=1.2, top_k=10, top_p=0.8, min_tokens=6, seed=7),
]
HISTORIES = [[1, 2, 2], [], [], [9, 9, 30], [7], []]


def test_slot_sampler_picks_the_tokens_sample_rows_picks_step_after_step() -> None:
    torch.manual_seed(0)
    slots = [6, 0, 3, 9, 2, 4]  # any slots, in any order
    scratch = 10
    ours = SlotSampler(scratch + 1, VOCAB, [END], SUPPRESS, torch.device("cpu"))
    ours.reset(slots, PARAMS, HISTORIES)
    ref = [RequestSampler(p, [END], SUPPRESS, history=h) for p, h in zip(PARAMS, HISTORIES, strict=True)]
    rows = len(slots) + 2  # two padding rows on the scratch slot
    slot_idx = torch.tensor(slots + [scratch] * 2)
    for step in range(40):
        logits = torch.randn(len(slots), VOCAB) * 3
        logits[:, END] += 4.0 if step % 3 == 0 else 0.0  # the end token is often the best
        logits[:, 9] += 2.0  # and a penalized one
        expected = sample_rows(ref, logits).tolist()
        for s, t in zip(ref, expected, strict=True):
            s.record(t)
        padded = torch.cat([logits, torch.randn(2, VOCAB)])
        got = ours.sample(padded, slot_idx, ours.draws(slots, rows))
        assert got[: len(slots)].tolist() == expected, f"step {step}"
    # the slots' state is what the reference samplers recorded
    for slot, s in zip(slots, ref, strict=True):
        assert int(ours.generated[slot]) == s.generated == 40
        assert set(ours.seen[slot].nonzero()[:, 0].tolist()) == s.seen


def test_min_tokens_and_suppressed_ids_hold_in_every_row() -> None:
    ours = SlotSampler(3, VOCAB, [END], SUPPRESS, torch.device("cpu"))
    ours.reset([0, 1], [Sampling(min_tokens=2), Sampling(temperature=1.0, seed=1)], [[], []])
    logits = torch.full((2, VOCAB), -5.0)
    logits[:, END] = 10.0
    logits[:, SUPPRESS] = 20.0
    logits[:, 40] = 1.0
    idx = torch.tensor([0, 1])
    first = ours.sample(logits, idx, ours.draws([0, 1], 2)).tolist()
    assert first[0] == 40  # no end token before min_tokens, never a suppressed one
    assert first[1] == END
    ours.sample(logits, idx, ours.draws([0, 1], 2))
    assert ours.sample(logits, idx, ours.draws([0, 1], 2)).tolist()[0] == END  # min_tokens reached


def test_a_reset_slot_forgets_its_previous_request() -> None:
    ours = SlotSampler(2, VOCAB, [END], None, torch.device("cpu"))
    ours.reset([0], [Sampling(repetition_penalty=2.0)], [[3]])
    logits = torch.zeros(1, VOCAB)
    logits[0, 3], logits[0, 4] = 1.0, 0.9
    idx = torch.tensor([0])
    assert ours.sample(logits, idx, torch.zeros(1)).tolist() == [4]  # 3 is penalized
    ours.reset([0], [Sampling()], [[]])
    assert ours.sample(logits, idx, torch.zeros(1)).tolist() == [3]
    assert int(ours.generated[0]) == 1
    scores = process_rows([RequestSampler(Sampling(), [END])], logits)
    assert int(scores.argmax()) == 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_sampling_replays_from_a_cuda_graph_as_it_runs_eagerly() -> None:
    device = torch.device("cuda")
    slots, scratch = [2, 0, 1], 3
    idx = torch.tensor([*slots, scratch], device=device)
    logits = torch.randn(4, VOCAB, device=device) * 3
    tokens = {}
    for graphed in (False, True):
        ours = SlotSampler(scratch + 1, VOCAB, [END], SUPPRESS, device)
        run = StepGraphs(_one_output(ours), "sampling", enabled=graphed)
        if graphed:  # capture on the scratch slot, as the talker does, then reset the real slots
            pad = torch.full_like(idx, scratch)
            run(4, {"logits": logits, "slot_idx": pad, "u": torch.zeros(4, device=device)})
        ours.reset(slots, PARAMS[1:4], HISTORIES[1:4])
        got = [run(4, {"logits": logits, "slot_idx": idx, "u": ours.draws(slots, 4)})[0] for _ in range(20)]
        tokens[graphed] = torch.stack(got)[:, :3].tolist()
        assert [int(ours.generated[s]) for s in slots] == [20, 20, 20]
    assert tokens[True] == tokens[False]


def _one_output(sampler: SlotSampler):
    return lambda **tensors: (sampler.sample(**tensors),)


@pytest.mark.parametrize("shape", [(), (15,)])
def test_draws_taken_in_blocks_are_the_draws_of_one_call_a_step(shape: tuple[int, ...]) -> None:
    ours = UniformDraws(torch.Generator().manual_seed(5), shape, block=8)
    gen = torch.Generator().manual_seed(5)
    for step in range(20):  # across block boundaries
        expected = torch.rand(shape, generator=gen).numpy()
        assert np.array_equal(ours.take(), expected), f"step {step}"
