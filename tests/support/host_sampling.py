"""The host reference for sampling: transformers' logits-processor semantics, per request, batched.

Order as in transformers' generate(): repetition penalty, min-new-tokens (end ids masked),
suppressed tokens, then temperature, top-k, top-p. Temperature 0 (or top-k 1) is greedy (first maximum).

The runners sample with `omnivoice.runners.slot_sampling.SlotSampler`, whose state lives on the
device. This plain version (each request's state in a `RequestSampler` on the host, masks rebuilt from
Python lists every step) is what the tests hold it to: test_sampling checks it against transformers'
own processors, test_slot_sampling checks that SlotSampler picks the same tokens for the same draws.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from omnivoice.runners.transfer import to_device
from omnivoice.types import Sampling


class RequestSampler:
    def __init__(
        self,
        params: Sampling,
        end_ids: Sequence[int],
        suppress: torch.Tensor | None = None,
        history: Sequence[int] = (),
        device: torch.device | str = "cpu",
    ) -> None:
        self.params = params
        self.end_ids = list(end_ids)
        self.suppress = suppress  # long tensor of ids that may never be sampled
        self.history: list[int] = list(history)  # ids the repetition penalty looks at
        self.seen = set(self.history)  # its distinct ids
        self.generated = 0
        # top-k 1 keeps only the best token: sampling it is the argmax, so no draw (and no sort)
        self.greedy = params.temperature <= 0 or params.top_k == 1
        self.generator: torch.Generator | None = None
        if not self.greedy:
            self.generator = torch.Generator(device="cpu")
            if params.seed is not None:
                self.generator.manual_seed(params.seed)
            else:
                self.generator.seed()

    def process(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [V] (float32) -> processed scores [V]."""
        return process_rows([self], logits[None])[0]

    def sample(self, logits: torch.Tensor) -> int:
        """Sample one token from logits [V] and record it."""
        token = int(sample_rows([self], logits[None])[0])
        self.record(token)
        return token

    def record(self, token: int) -> None:
        """Account for a sampled token (history for the repetition penalty, count for min_tokens)."""
        self.history.append(token)
        self.seen.add(token)
        self.generated += 1

    def is_end(self, token: int) -> bool:
        return token in self.end_ids


def process_rows(samplers: Sequence[RequestSampler], logits: torch.Tensor) -> torch.Tensor:
    """logits [B, V] -> processed float32 scores [B, V], row b with samplers[b]'s rules."""
    scores = logits.float().clone()
    device = scores.device
    # repetition penalty, one masked update per distinct penalty (a Python-float scalar as transformers')
    for penalty in {s.params.repetition_penalty for s in samplers} - {1.0}:
        rows: list[int] = []
        ids: list[int] = []
        for b, s in enumerate(samplers):
            if s.params.repetition_penalty == penalty:
                rows += [b] * len(s.seen)
                ids += sorted(s.seen)
        if ids:
            r, i = to_device(rows, device), to_device(ids, device)
            picked = scores[r, i]
            scores[r, i] = torch.where(picked < 0, picked * penalty, picked / penalty)
    rows, ids = [], []
    for b, s in enumerate(samplers):  # min-new-tokens: no end token yet
        if s.generated < s.params.min_tokens and s.end_ids:
            rows += [b] * len(s.end_ids)
            ids += s.end_ids
    if ids:
        scores[to_device(rows, device), to_device(ids, device)] = float("-inf")
    suppress = {id(s.suppress): s.suppress for s in samplers if s.suppress is not None}
    if len(suppress) == 1 and all(s.suppress is not None for s in samplers):
        scores[:, next(iter(suppress.values()))] = float("-inf")  # the usual case: one shared list
    else:
        for b, s in enumerate(samplers):
            if s.suppress is not None:
                scores[b, s.suppress] = float("-inf")
    return scores


def sample_rows(samplers: Sequence[RequestSampler], logits: torch.Tensor) -> torch.Tensor:
    """Tokens [B] (long, on the logits' device) for logits [B, V]; callers `record` the ones they keep."""
    scores = process_rows(samplers, logits)
    greedy = [b for b, s in enumerate(samplers) if s.greedy]
    if len(greedy) == len(samplers):
        return scores.argmax(-1)
    drawn = _draw([s for s in samplers if not s.greedy], scores, greedy)
    if not greedy:
        return drawn
    tokens = scores.argmax(-1)
    sampled = [b for b, s in enumerate(samplers) if not s.greedy]
    tokens[to_device(sampled, scores.device)] = drawn
    return tokens


def _draw(samplers: list[RequestSampler], scores: torch.Tensor, greedy: list[int]) -> torch.Tensor:
    device = scores.device
    if greedy:
        keep = [b for b in range(scores.shape[0]) if b not in set(greedy)]
        scores = scores[to_device(keep, device)]
    params = [s.params for s in samplers]
    scores = scores / to_device([p.temperature for p in params], device, torch.float32)[:, None]
    ks = [p.top_k if 0 < p.top_k < scores.shape[-1] else 0 for p in params]
    if any(ks):
        top = torch.topk(scores, max(ks), dim=-1).values  # [B, kmax]
        k = to_device([max(k, 1) - 1 for k in ks], device)
        kth = top.gather(1, k[:, None])
        kth = torch.where(to_device([k > 0 for k in ks], device, torch.bool)[:, None], kth, float("-inf"))
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if any(p.top_p < 1.0 for p in params):
        sorted_scores, order = torch.sort(scores, descending=False, dim=-1)
        cum = sorted_scores.softmax(-1).cumsum(-1)
        drop = cum <= (1 - to_device([p.top_p for p in params], device, torch.float32))[:, None]
        drop[:, -1] = False  # always keep the most likely token
        scores = scores.scatter(1, order, sorted_scores.masked_fill(drop, float("-inf")))
    cdf = scores.softmax(-1).cumsum(-1)  # [B, V]
    assert all(s.generator is not None for s in samplers)
    u = [float(torch.rand((), generator=s.generator)) for s in samplers]  # each row's own stream
    target = to_device(u, device, torch.float32)[:, None] * cdf[:, -1:]
    # first token whose cdf exceeds u: never a zero-probability token
    return torch.searchsorted(cdf, target, right=True)[:, 0].clamp_max(cdf.shape[-1] - 1)
