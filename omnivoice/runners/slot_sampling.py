"""Token sampling whose per-request state lives on the device, one row per KV slot.

Sampling that rebuilds each step's repetition-penalty and min-tokens masks from Python lists (the
host reference in tests/support/host_sampling.py) cannot queue a decode step before the previous step's
tokens are back on the host. `SlotSampler` keeps that state as device tensors indexed by KV slot (the ids a
request has seen, how many tokens it has sampled, its parameters), so a whole step, sampling included,
is a fixed-shape function of device tensors: it can be captured in a CUDA graph, and the next step can
be queued while the host still handles this one's tokens.

Semantics are the reference's (transformers' order: repetition penalty, min-new-tokens, suppressed
tokens, then temperature, top-k, top-p; greedy is the first maximum), and for the same uniform draw
it picks the same token. The draws come from each request's own host generator, as there.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from omnivoice.runners.transfer import to_device
from omnivoice.types import Sampling


def request_generator(seed: int | None) -> torch.Generator:
    """A request's own host generator: seeded with `seed`, or from the OS when it has none."""
    gen = torch.Generator(device="cpu")
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


class UniformDraws:
    """A request's uniform draws from its own host generator, one `shape` row a step.

    The CPU generator fills a tensor element by element, in order, so the k-th row of one
    `torch.rand((block, *shape))` is what the k-th `torch.rand(shape)` call would have drawn: rows are
    drawn a block at a time and a step takes its row with no torch call, the same values as a draw
    per step. Only these rows use the generator, so drawing ahead changes none of them."""

    def __init__(self, gen: torch.Generator, shape: tuple[int, ...] = (), block: int = 32) -> None:
        self.gen = gen
        self.shape = shape
        self.block = block
        self._rows = np.zeros((0, *shape), dtype=np.float32)
        self._next = 0

    def take(self) -> np.ndarray:
        """The next row [*shape] (float32)."""
        if self._next == len(self._rows):
            self._rows = torch.rand((self.block, *self.shape), generator=self.gen).numpy()
            self._next = 0
        row = self._rows[self._next]
        self._next += 1
        return row


class SlotSampler:
    def __init__(
        self,
        num_slots: int,
        vocab: int,
        end_ids: Sequence[int],
        suppress: torch.Tensor | None,
        device: torch.device,
    ) -> None:
        """num_slots: every slot a row may name, scratch slot included."""
        self.device = device
        self.vocab = vocab
        self.end_ids = list(end_ids)
        self.seen = torch.zeros(num_slots, vocab, dtype=torch.bool, device=device)
        self.generated = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.min_tokens = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.penalty = torch.ones(num_slots, dtype=torch.float32, device=device)
        self.temperature = torch.ones(num_slots, dtype=torch.float32, device=device)
        self.top_k = torch.full((num_slots,), vocab, dtype=torch.long, device=device)
        self.top_p = torch.ones(num_slots, dtype=torch.float32, device=device)
        self.greedy = torch.ones(num_slots, dtype=torch.bool, device=device)
        self.end_mask = torch.zeros(vocab, dtype=torch.bool, device=device)
        if self.end_ids:
            self.end_mask[to_device(self.end_ids, device)] = True
        self.suppress_mask = torch.zeros(vocab, dtype=torch.bool, device=device)
        if suppress is not None and suppress.numel():
            self.suppress_mask[suppress.to(device)] = True
        self.generators: dict[int, UniformDraws] = {}  # slot -> the request's draws (sampled slots)

    def reset(
        self, slots: Sequence[int], params: Sequence[Sampling], histories: Sequence[Sequence[int]]
    ) -> None:
        """Give `slots` to new requests: their parameters, seen ids (`histories`) and generators."""
        if not slots:
            return
        idx = to_device(list(slots), self.device)
        greedy = [p.temperature <= 0 or p.top_k == 1 for p in params]
        self.generated[idx] = 0
        self.min_tokens[idx] = to_device([p.min_tokens for p in params], self.device)
        self.penalty[idx] = to_device([p.repetition_penalty for p in params], self.device, torch.float32)
        temps = [p.temperature if not g else 1.0 for p, g in zip(params, greedy, strict=True)]
        self.temperature[idx] = to_device(temps, self.device, torch.float32)
        ks = [p.top_k if 0 < p.top_k < self.vocab else self.vocab for p in params]
        self.top_k[idx] = to_device(ks, self.device)
        self.top_p[idx] = to_device([p.top_p for p in params], self.device, torch.float32)
        self.greedy[idx] = to_device(greedy, self.device, torch.bool)
        self.seen[idx] = False
        rows = [b for b, h in enumerate(histories) for _ in set(h)]
        ids = [i for h in histories for i in sorted(set(h))]
        if ids:
            self.seen[idx[to_device(rows, self.device)], to_device(ids, self.device)] = True
        for slot, p, g in zip(slots, params, greedy, strict=True):
            self.generators.pop(slot, None)
            if not g:
                self.generators[slot] = UniformDraws(request_generator(p.seed))

    def release(self, slot: int) -> None:
        self.generators.pop(slot, None)

    def draws(self, slots: Sequence[int], rows: int) -> torch.Tensor:
        """One uniform per row [rows] (float32, on the device): from each sampled slot's generator, 0
        for greedy slots and padding rows."""
        u = np.zeros(rows, dtype=np.float32)
        for b, slot in enumerate(slots):
            if (draws := self.generators.get(slot)) is not None:
                u[b] = draws.take()
        return to_device(torch.from_numpy(u), self.device, torch.float32)

    def sample(
        self, logits: torch.Tensor, slot_idx: torch.Tensor, u: torch.Tensor, draw: bool = True
    ) -> torch.Tensor:
        """logits [R, V], slot_idx [R], u [R] -> tokens [R] (long). Records the tokens in the rows'
        slots (seen ids, count). Device ops of fixed shapes only: no host sync. `draw=False` when
        every row is greedy skips the draw (a sort of the whole vocabulary)."""
        scores = logits.float()
        pen = self.penalty[slot_idx][:, None]
        penalized = torch.where(scores < 0, scores * pen, scores / pen)
        scores = torch.where(self.seen[slot_idx], penalized, scores)
        early = (self.generated[slot_idx] < self.min_tokens[slot_idx])[:, None]
        scores = scores.masked_fill((early & self.end_mask) | self.suppress_mask, float("-inf"))
        best = scores.argmax(-1)
        if not draw:
            return self._record(slot_idx, best)
        scores = scores / self.temperature[slot_idx][:, None]
        ordered = scores.sort(-1, descending=True).values  # [R, V]
        kth = ordered.gather(1, (self.top_k[slot_idx] - 1)[:, None])
        ordered = ordered.masked_fill(ordered < kth, float("-inf"))
        scores = scores.masked_fill(scores < kth, float("-inf"))
        # top-p over the top-k survivors, ascending as transformers sorts: the lowest scores whose mass
        # stays within 1 - top_p go (never the most likely one)
        ascending = ordered.flip(-1)
        cum = ascending.softmax(-1).cumsum(-1)
        drop = cum <= (1 - self.top_p[slot_idx])[:, None]
        drop[:, -1] = False
        floor = ascending.masked_fill(drop, float("inf")).amin(-1, keepdim=True)  # lowest kept score
        scores = scores.masked_fill(scores < floor, float("-inf"))
        cdf = scores.softmax(-1).cumsum(-1)
        target = u[:, None] * cdf[:, -1:]
        drawn = torch.searchsorted(cdf, target.contiguous(), right=True)[:, 0].clamp_max(cdf.shape[-1] - 1)
        return self._record(slot_idx, torch.where(self.greedy[slot_idx], best, drawn))

    def _record(self, slot_idx: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        # device values only (an indexed assignment of a Python scalar copies it from the host, which a
        # CUDA graph cannot capture)
        self.seen.index_put_((slot_idx, tokens), torch.ones_like(tokens, dtype=torch.bool))
        self.generated.index_put_((slot_idx,), self.generated[slot_idx] + 1)
        return tokens
