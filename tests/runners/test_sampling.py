import torch
from transformers.generation.logits_process import (
    MinNewTokensLengthLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
)

from omnivoice.types import Sampling
from tests.support.host_sampling import RequestSampler, process_rows, sample_rows


def test_processing_matches_transformers_processors() -> None:
    torch.manual_seed(0)
    logits = torch.randn(50)
    history = [3, 7, 7, 11]
    sampler = RequestSampler(
        Sampling(repetition_penalty=1.3, min_tokens=2),
        end_ids=[5],
        suppress=torch.tensor([40, 41]),
        history=history,
    )
    ours = sampler.process(logits)
    ids = torch.tensor([history])
    ref = RepetitionPenaltyLogitsProcessor(1.3)(ids, logits[None].clone())
    ref = MinNewTokensLengthLogitsProcessor(prompt_length_to_skip=4, min_new_tokens=2, eos_token_id=5)(
        ids, ref
    )
    ref = SuppressTokensLogitsProcessor([40, 41])(ids, ref)
    torch.testing.assert_close(ours, ref[0], rtol=0, atol=0)


def test_greedy_takes_first_maximum_and_tracks_history() -> None:
    s = RequestSampler(Sampling(), end_ids=[2])
    assert s.sample(torch.tensor([0.0, 3.0, 3.0, 1.0])) == 1
    assert s.history == [1] and s.generated == 1
    assert s.is_end(2) and not s.is_end(1)


def test_min_tokens_blocks_end_until_reached() -> None:
    s = RequestSampler(Sampling(min_tokens=1), end_ids=[0])
    assert s.sample(torch.tensor([5.0, 1.0])) == 1
    assert s.sample(torch.tensor([5.0, 1.0])) == 0


def test_seeded_sampling_is_reproducible_and_respects_top_k() -> None:
    logits = torch.linspace(0, 4, 20)
    draws = []
    for _ in range(2):
        s = RequestSampler(Sampling(temperature=1.0, top_k=3, seed=42), end_ids=[])
        draws.append([s.sample(logits) for _ in range(30)])
    assert draws[0] == draws[1]
    assert set(draws[0]) <= {17, 18, 19}


def test_top_p_keeps_only_the_nucleus() -> None:
    logits = torch.tensor([10.0, 9.0, -5.0, -6.0])
    s = RequestSampler(Sampling(temperature=1.0, top_p=0.5, seed=1), end_ids=[])
    assert {s.sample(logits) for _ in range(50)} == {0}


def test_a_batch_is_processed_and_sampled_row_by_row() -> None:
    torch.manual_seed(1)
    logits = torch.randn(4, 64)
    logits[3, 10] = 20.0  # row 3's 0.3 nucleus is this one token
    suppress = torch.tensor([60, 61])
    samplers = [
        RequestSampler(Sampling(repetition_penalty=1.3, min_tokens=3), [5], suppress, history=[1, 2, 2]),
        RequestSampler(Sampling(temperature=0.7, top_k=4, seed=3), [5], suppress),
        RequestSampler(Sampling(repetition_penalty=1.1), [5], suppress, history=[9]),
        RequestSampler(Sampling(temperature=1.0, top_p=0.3, seed=4), [5], suppress),
    ]
    batch = process_rows(samplers, logits)
    for b, s in enumerate(samplers):
        torch.testing.assert_close(batch[b], s.process(logits[b]), rtol=0, atol=0)
    for _ in range(20):
        tokens = sample_rows(samplers, logits).tolist()
        assert tokens[0] == int(batch[0].argmax()) and tokens[2] == int(batch[2].argmax())
        assert tokens[1] in set(torch.topk(batch[1], 4).indices.tolist())
        assert tokens[3] == 10


def test_top_k_one_is_the_argmax_of_the_processed_scores_without_a_draw() -> None:
    torch.manual_seed(1)
    logits = torch.randn(4, 300)
    params = Sampling(temperature=0.4, top_p=0.9, top_k=1, repetition_penalty=1.05)
    samplers = [RequestSampler(params, end_ids=[5], history=[int(logits[b].argmax())]) for b in range(4)]
    assert all(s.greedy and s.generator is None for s in samplers)
    tokens = sample_rows(samplers, logits)
    # the repetition penalty applies first: a row's top logit (in its history) may lose its place
    assert torch.equal(tokens, process_rows(samplers, logits).argmax(-1))
    mixed = [samplers[0], RequestSampler(Sampling(temperature=1.0, top_k=5, seed=3), end_ids=[])]
    out = sample_rows(mixed, logits[:2])
    assert out[0] == process_rows(mixed[:1], logits[:1]).argmax(-1)[0]
    assert out[1] in torch.topk(logits[1], 5).indices
