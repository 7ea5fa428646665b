"""What a thinker token read back from the device becomes: the token's output, the talker's chunk
while the request is spoken, and the request's end (an end token, a grammar's error, its token limit).

The talker never speaks a function call: its text ends where one opens (in a request that offers
functions; without, the text is all said, as written).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from omnivoice.messages import StageFinished, ThinkerChunk, TokenOutput
from omnivoice.runners.constraints import Constraints
from omnivoice.runners.priority import PlaybackPolicy
from omnivoice.runners.slot_sampling import SlotSampler
from omnivoice.runners.thinker_seq import ThinkerSeq


class TokenReader:
    """Turns each read-back token of a running request into outputs, and says when it ends it."""

    def __init__(
        self, sampler: SlotSampler, constraints: Constraints, policy: PlaybackPolicy, tool_call_id: int | None
    ) -> None:
        self.sampler = sampler
        self.constraints = constraints
        self.policy = policy
        self.tool_call_id = tool_call_id

    def read(
        self,
        seq: ThinkerSeq,
        token: int,
        count: int,
        embed: np.ndarray | None,
        prompt: tuple[torch.Tensor, torch.Tensor] | None,
        outs: list[Any],
    ) -> bool:
        """Book `seq`'s token (its `count`th; `embed` [1, H] its embedding, for the talker; `prompt`
        the prompt's embeddings and hidden states, with its first) and add what it makes to `outs`.
        True: the request ended with it."""
        rid = seq.request.request_id
        seq.generated.append(token)
        seq.playback.frames += 1
        if not seq.request.want_audio:
            seq.playback.start(self.policy.clock())  # a text answer's first token is out
        outs.append(TokenOutput(rid, (token,)))
        reason, error = None, None
        if token in self.sampler.end_ids:
            reason = "stop"
        elif (error := self.constraints.advance(rid, token)) is not None:
            reason = "error"
        elif count >= seq.max_tokens:
            reason = "length"
        if seq.request.want_audio and seq.talking:
            assert embed is not None
            seq.talking = token != self.tool_call_id or seq.request.tools is None
            final = reason is not None or not seq.talking
            outs.append(talker_chunk(seq, token, embed, final, prompt))
        if reason is None:
            return False
        count = len(seq.generated)
        outs.append(StageFinished(rid, "thinker", reason, count, seq.prompt_len, error, seq.cached))
        return True


def talker_chunk(
    seq: ThinkerSeq,
    token: int,
    embed: np.ndarray,
    final: bool,
    prompt: tuple[torch.Tensor, torch.Tensor] | None,
) -> ThinkerChunk:
    """The talker's chunk of `seq`'s `token` (`embed` [1, H]); a request's first chunk also brings its
    prompt."""
    # The final token is never fed through the thinker, so the talker never sees it (as in
    # transformers' generate()): the chunk that reports the end carries no token, nor does the one
    # that ends the talker's text at a function call.
    rid = seq.request.request_id
    ids: tuple[int, ...] = () if final else (token,)
    embeds = None if final else embed  # [1, H]
    if prompt is None:
        return ThinkerChunk(rid, ids, embeds, final)
    req = seq.request
    return ThinkerChunk(
        rid, ids, embeds, final, req.prompt.input_ids, prompt[0].numpy(), prompt[1].numpy(), req
    )
