"""The talker's prefill: each starting request's prompt, refused when it leaves no room for a frame,
and the batch's forward through the decoder stack, every prompt in its own slot from position 0.

The requests that start in a step are prefilled together, right-padded to the longest prompt; the
last position of each row gives its first codebook-0 token.
"""

from __future__ import annotations

import torch

from omnivoice.runners.decoder import DecoderStack
from omnivoice.runners.kv_cache import SlotKVCache
from omnivoice.runners.talker_inputs import TalkerInputs
from omnivoice.runners.talker_seq import TalkerSeq
from omnivoice.runners.transfer import to_device


def prompt_inputs(inputs: TalkerInputs, seq: TalkerSeq, max_seq_len: int) -> torch.Tensor:
    """The talker's prompt for a request [P, Ht]; ValueError if it leaves no room for a frame."""
    first_text = inputs.host_rows(seq.text[0][None])[0]
    prompt = inputs.prompt(seq.user_part, seq.role_embeds, first_text, seq.request.voice)
    if prompt.shape[0] + 2 > max_seq_len:
        raise ValueError(
            f"talker context of {prompt.shape[0]} positions leaves no room for audio in its "
            f"max_seq_len of {max_seq_len}"
        )
    return prompt


def forward_prefill(
    stack: DecoderStack, cache: SlotKVCache, seqs: list[TalkerSeq], prompts: list[torch.Tensor]
) -> torch.Tensor:
    """Run the prompts [P, Ht] of `seqs` (each in its slot) through `stack` in one forward: each row's
    hidden state at its prompt's last position [B, Ht]."""
    lengths = [x.shape[0] for x in prompts]
    longest = max(lengths)
    inputs = torch.stack(
        [torch.nn.functional.pad(x, (0, 0, 0, longest - x.shape[0])) for x in prompts]
    )  # [B, P, Ht], right-padded
    slots = [s.slot for s in seqs]
    for seq in seqs:
        cache.rope_delta[seq.slot] = seq.rope_delta
    if any(seq.rope is not None for seq in seqs):
        rope = _rope_rows(seqs, lengths, longest).to(inputs.device)
        h, _ = stack.forward(inputs, cache, slots, [0] * len(seqs), (), lengths, rope)
    else:
        h, _ = stack.prefill(inputs, cache, slots, [0] * len(seqs), lengths=lengths)
    return h[torch.arange(len(seqs), device=h.device), to_device(lengths, h.device) - 1]


def _rope_rows(seqs: list[TalkerSeq], lengths: list[int], t: int) -> torch.Tensor:
    """A prefill batch's rotary positions [3, B, t]: a prompt without images at its cache positions;
    the padding repeats its row's last."""
    rows = []
    for seq, n in zip(seqs, lengths, strict=True):
        rope = seq.rope[:, :n] if seq.rope is not None else torch.arange(n).expand(3, -1)
        rows.append(torch.cat([rope, rope[:, -1:].expand(3, t - n)], dim=1))
    return torch.stack(rows, dim=1)
