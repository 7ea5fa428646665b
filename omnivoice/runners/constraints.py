"""Grammar-constrained decoding for the thinker: one llguidance matcher per constrained request.

Each step, the rows of constrained requests get their allowed-token bitmask (computed on the host by
llguidance from what each request wrote so far) and every other token's logit is set to -inf on the
device before sampling; each token read back advances its request's matcher. A finished grammar
allows only the model's end tokens, so the answer ends as the model ends it. Rows of unconstrained
requests are left alone, and a step without constrained rows does nothing here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from llguidance import LLExecutor, LLMatcher
from llguidance.torch import fill_next_token_bitmask_par

from omnivoice.models.grammars import grammar_tokenizer, matcher_error, matcher_for
from omnivoice.runners.transfer import to_device
from omnivoice.types import Grammar


class Constraints:
    def __init__(
        self, hf_tokenizer: Any | None, vocab: int, end_ids: Sequence[int], device: torch.device
    ) -> None:
        """`hf_tokenizer`: the served model's (None: grammars are refused); `vocab`: the width of the
        logits. llguidance's view of the tokenizer is built here, once."""
        self.tokenizer = None if hf_tokenizer is None else grammar_tokenizer(hf_tokenizer, vocab, end_ids)
        self.vocab = vocab
        self.device = device
        self.matchers: dict[str, LLMatcher] = {}  # request id -> its matcher
        self._executor: LLExecutor | None = None  # made at the first constrained step
        self._bits = torch.arange(32, dtype=torch.int32, device=device)

    def add(self, request_id: str, grammar: Grammar) -> None:
        """Constrain `request_id` to `grammar`; ValueError (a message for the client) when it cannot
        be used."""
        if self.tokenizer is None:
            raise ValueError("this server cannot constrain decoding: its thinker has no tokenizer")
        self.matchers[request_id] = matcher_for(grammar, self.tokenizer)

    def drop(self, request_id: str) -> None:
        self.matchers.pop(request_id, None)

    def any(self, request_ids: Iterable[str]) -> bool:
        """Whether any of `request_ids` is constrained (at once False while none is)."""
        return bool(self.matchers) and any(rid in self.matchers for rid in request_ids)

    def mask(self, logits: torch.Tensor, request_ids: Sequence[str]) -> None:
        """logits [len(request_ids), V], in place: each constrained row's disallowed tokens to -inf.
        The rows' matchers must have taken every token sampled before (a host sync on a GPU)."""
        rows = [b for b, rid in enumerate(request_ids) if rid in self.matchers]
        if not rows:
            return
        words = (self.vocab + 31) // 32
        host = torch.empty((len(rows), words), dtype=torch.int32)
        if self._executor is None:
            self._executor = LLExecutor()
        fill_next_token_bitmask_par(
            self._executor, [(self.matchers[request_ids[b]], i) for i, b in enumerate(rows)], host
        )
        bitmask = to_device(host, self.device, torch.int32)  # [n, words]
        allowed = ((bitmask[:, :, None] >> self._bits) & 1).bool().reshape(len(rows), -1)  # [n, 32 * words]
        index = to_device(rows, self.device)
        width = logits.shape[-1]
        logits[index] = logits[index].masked_fill(~allowed[:, :width], float("-inf"))

    def advance(self, request_id: str, token: int) -> str | None:
        """Feed a token read back to the request's matcher (if it has one); why the token breaks its
        grammar, or None."""
        matcher = self.matchers.get(request_id)
        if matcher is None or matcher.consume_token(token):
            return None
        return f"the answer left its grammar: {matcher_error(matcher)}"
