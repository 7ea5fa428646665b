"""Token sampling with transformers' logits-processor semantics, per request.

Order as in transformers' generate(): repetition penalty, min-new-tokens (end ids masked),
suppressed tokens, then temperature, top-k, top-p. Temperature 0 is greedy (first maximum).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from omnivoice.engine.types import Sampling


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
        self.generated = 0
        self.generator: torch.Generator | None = None
        if params.temperature > 0:
            self.generator = torch.Generator(device="cpu")
            if params.seed is not None:
                self.generator.manual_seed(params.seed)
            else:
                self.generator.seed()

    def process(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [V] (float32) -> processed scores [V]."""
        p = self.params
        scores = logits.float().clone()
        if p.repetition_penalty != 1.0 and self.history:
            ids = torch.tensor(sorted(set(self.history)), device=scores.device)
            picked = scores[ids]
            scores[ids] = torch.where(
                picked < 0, picked * p.repetition_penalty, picked / p.repetition_penalty
            )
        if self.generated < p.min_tokens and self.end_ids:
            scores[self.end_ids] = float("-inf")
        if self.suppress is not None:
            scores[self.suppress] = float("-inf")
        return scores

    def sample(self, logits: torch.Tensor) -> int:
        scores = self.process(logits)
        p = self.params
        token = int(torch.argmax(scores)) if p.temperature <= 0 else self._draw(scores / p.temperature)
        self.history.append(token)
        self.generated += 1
        return token

    def _draw(self, scores: torch.Tensor) -> int:
        p = self.params
        if 0 < p.top_k < scores.shape[-1]:
            kth = torch.topk(scores, p.top_k).values[-1]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if p.top_p < 1.0:
            sorted_scores, order = torch.sort(scores, descending=False)
            cum = sorted_scores.softmax(-1).cumsum(-1)
            drop = cum <= (1 - p.top_p)
            drop[-1] = False  # always keep the most likely token
            scores = scores.scatter(0, order, sorted_scores.masked_fill(drop, float("-inf")))
        probs = scores.softmax(-1).cpu()
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def is_end(self, token: int) -> bool:
        return token in self.end_ids
