"""The code predictor (MTP): codebooks 1..G-1 of a frame, G-1 sequential steps, batched over requests."""

from __future__ import annotations

from typing import Any

import torch

from omnivoice.engine.types import Sampling
from omnivoice.runners.decoder import DecoderStack
from omnivoice.runners.sampling import RequestSampler, sample_rows

# transformers' generate() samples the residual codebooks with these when the talker samples
_SAMPLED = Sampling(temperature=1.0, top_k=50, top_p=0.8)
_GREEDY = Sampling(temperature=0.0)


class CodePredictor:
    def __init__(self, module: Any, max_batch: int, device: torch.device) -> None:
        self.module = module
        self.stack = DecoderStack(module.model, multimodal_rope=False)
        self.embeds = module.model.codec_embedding  # G-1 embeddings, one per residual codebook
        self.heads = module.lm_head  # G-1 heads
        self.groups = len(self.heads) + 1
        self.cache = self.stack.make_cache(max_batch, self.groups + 1, module.dtype, device)
        self.device = device

    def predict(
        self, talker_hidden: torch.Tensor, code0_embed: torch.Tensor, seqs: list[Any]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """talker_hidden, code0_embed: [B, Ht] -> residual codes [B, G-1], their embeddings [B, G-1, Ht]."""
        b = talker_hidden.shape[0]
        slots = [self.cache.alloc() for _ in range(b)]
        try:
            samplers = [self._sampler(s) for s in seqs]
            h, _ = self.stack.forward(
                torch.stack([talker_hidden, code0_embed], dim=1), self.cache, slots, [0] * b
            )
            codes: list[torch.Tensor] = []
            embeds: list[torch.Tensor] = []
            for k in range(self.groups - 1):
                logits = self.heads[k](h[:, -1])  # [B, V]
                code = sample_rows(samplers, logits)  # [B], stays on the device: no sync per codebook
                codes.append(code)
                embeds.append(self.embeds[k](code))
                if k == self.groups - 2:
                    break
                starts = [self.cache.lengths[s] for s in slots]
                h, _ = self.stack.forward(embeds[-1][:, None], self.cache, slots, starts)
        finally:
            for s in slots:
                self.cache.release(s)
        return torch.stack(codes, dim=1), torch.stack(embeds, dim=1)

    @staticmethod
    def _sampler(seq: Any) -> RequestSampler:
        params = _SAMPLED if seq.request.talker.temperature > 0 else _GREEDY
        if params is _SAMPLED and seq.request.talker.seed is not None:
            params = Sampling(temperature=1.0, top_k=50, top_p=0.8, seed=seq.request.talker.seed + seq.frames)
        return RequestSampler(params, end_ids=())
