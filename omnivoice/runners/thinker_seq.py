"""A thinker request's bookkeeping from its admission on: admitted and waiting for the batched
prefill (`Pending`), then running (`ThinkerSeq`: its slot, the tokens queued and read back, what a
prefix-cache entry of its conversation needs), and a queued step as the host knows it. Also the
sampling a request runs with, and the playback a waiting request is ordered by."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from omnivoice.runners.prefix_cache import PrefixEntry
from omnivoice.runners.priority import Playback
from omnivoice.runners.vision_encoder import ImageInputs
from omnivoice.types import GenerationRequest, Sampling


@dataclass
class Pending:
    """A request admitted this step, waiting for the batched prefill."""

    request: GenerationRequest
    slot: int
    reuse: int  # prompt positions already in the slot (prefix cache)
    entry: PrefixEntry | None
    keys: list
    embeds: torch.Tensor  # [1, n - reuse, H]
    images: ImageInputs | None = None  # a prompt with images: its rotary positions and deepstack
    rope_delta: int = 0


@dataclass
class ThinkerSeq:
    """A running request, from its prefill to its end."""

    request: GenerationRequest
    slot: int
    max_tokens: int
    prompt_len: int
    # frames: tokens read back (the talker makes at most one frame of each while text streams in)
    playback: Playback
    cached: int = 0  # prompt positions taken from the conversation's cached prefix
    sampled: int = 0  # tokens queued so far (read back or not)
    talking: bool = True  # the talker still takes this request's tokens (until a function call opens)
    generated: list[int] = field(default_factory=list)  # tokens read back
    # kept only for requests with a cache_key: what a prefix-cache entry needs per position
    keys: list = field(default_factory=list)
    embeds: list[torch.Tensor] = field(default_factory=list)  # each [n, H]
    hidden: list[torch.Tensor] = field(default_factory=list)  # each [n, H]

    def prefix_entry(self) -> PrefixEntry:
        # the KV holds the prompt and every generated token but the last (never fed back); steps queued
        # past the end (overlap) fed more, which the entry leaves out
        fed = self.generated[:-1] if self.generated else []
        n = len(self.keys) + len(fed)
        return PrefixEntry(self.slot, self.keys + fed, torch.cat(self.embeds)[:n], torch.cat(self.hidden)[:n])


@dataclass
class QueuedStep:
    """A queued step, as the host knows it. Its results come back through `ReadBack`: the tokens [n],
    their embeddings for the talker [n, H] (or None), and per row of a prefill the prompt's
    embeddings and hidden states (or None)."""

    seqs: list[ThinkerSeq]
    counts: list[int]  # each row's tokens with this step's


def start_seq(
    p: Pending, embeds: torch.Tensor, hidden: torch.Tensor, max_seq_len: int
) -> tuple[ThinkerSeq, Sampling, tuple[torch.Tensor, torch.Tensor]]:
    """A prefilled request's running sequence, the sampling it runs with, and its whole prompt's
    embeddings and accept-layer hidden states [n, H]: those of its cached prefix, then `embeds` and
    `hidden` (its new positions')."""
    req, n = p.request, len(p.request.prompt.input_ids)
    if p.entry is not None:
        embeds = torch.cat([p.entry.embeds[: p.reuse], embeds])  # [n, H]
        hidden = torch.cat([p.entry.hidden[: p.reuse], hidden])
    params = _sampling(req, max_seq_len)
    seq = ThinkerSeq(req, p.slot, params.max_tokens, prompt_len=n, playback=Playback(stream=req.want_audio))
    seq.cached = p.reuse
    if req.cache_key:
        seq.keys, seq.embeds, seq.hidden = p.keys, [embeds], [hidden]
    return seq, params, (embeds, hidden)


def _sampling(req: GenerationRequest, max_seq_len: int) -> Sampling:
    """The sampling `req` runs with: its own, its token limit cut to the context left after its
    prompt, and no minimum length under a grammar (the grammar decides where the answer may end)."""
    max_new = min(req.thinker.max_tokens, max_seq_len - len(req.prompt.input_ids))
    params = req.thinker if max_new == req.thinker.max_tokens else _with_max(req.thinker, max_new)
    if params.grammar is not None and params.min_tokens:
        params = replace(params, min_tokens=0)
    return params


def waiting_playback(req: GenerationRequest) -> Playback:
    """A request waiting for its prefill: FIRST, but a prefill-only one (a session's early start,
    which no one is waiting on yet) is NORMAL."""
    return Playback(started_at=0.0, stream=False) if req.prefill_only else Playback(stream=req.want_audio)


def _with_max(s: Sampling, max_tokens: int) -> Sampling:
    return replace(s, max_tokens=max_tokens, min_tokens=min(s.min_tokens, max_tokens))
