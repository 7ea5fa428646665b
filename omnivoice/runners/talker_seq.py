"""A talker request's bookkeeping from its first text on (`TalkerSeq`: the text forwarded so far, its
slot, the codebook-0 tokens queued and the frames handed on) and a queued step as the host knows it.
Also the sampling a request runs with, the cap its complete text puts on its frames, and the code
predictor's draws of each request."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from omnivoice.config import TalkerStage
from omnivoice.runners.priority import Playback
from omnivoice.runners.slot_sampling import UniformDraws, request_generator
from omnivoice.runners.transfer import to_device
from omnivoice.types import GenerationRequest, Sampling

log = logging.getLogger(__name__)


@dataclass
class TalkerSeq:
    """A request from its first text to its end: waiting for a slot (`slot` < 0), then running."""

    request: GenerationRequest
    user_part: torch.Tensor  # [U, Ht] projected user turns
    role_embeds: torch.Tensor  # [3, Hth] thinker embeddings of "<|im_start|>assistant\n"
    text: list[np.ndarray] = field(default_factory=list)  # thinker embeddings of forwarded tokens [Hth]
    text_done: bool = False
    slot: int = -1
    max_tokens: int = 0  # codebook-0 tokens it may sample (the last one never gets its frame)
    sampled: int = 0  # codebook-0 tokens queued so far (its prefill's, then one per step)
    step: int = 0  # transformers' generation_step: index into the trailing text
    frames: int = 0  # frames handed on
    playback: Playback = field(default_factory=Playback)  # its frames: those handed on
    residual_rng: UniformDraws | None = None  # the code predictor's draws
    # a prompt with images: the rotary positions of the talker's prompt [3, >= P] and the shift after it
    rope: torch.Tensor | None = None
    rope_delta: int = 0
    accepted_at: float = 0.0  # monotonic: when its first text arrived

    def ready(self) -> bool:
        if self.slot < 0:
            return len(self.text) >= 1
        if self.sampled >= self.max_tokens:
            return False  # its last token is queued: it ends when that step is read back
        return self.step + 1 < len(self.text) or self.text_done


@dataclass
class QueuedStep:
    """A queued step, as the host knows it; its results come back through `ReadBack`."""

    seqs: list[TalkerSeq]
    counts: list[int]  # each row's codebook-0 tokens with this step's
    has_frames: bool  # results [n, G + 1]: each row's frame then its next token (a prefill: [n, 1])


def start_seq(seq: TalkerSeq, slot: int, prompt_len: int, cfg: TalkerStage) -> Sampling:
    """Book a request prefilled in `slot` with a prompt of `prompt_len` positions, its prefill's token
    queued: the sampling it runs with, its frames cut to the context left after its prompt."""
    seq.slot = slot
    p = codec_token_sampling(seq.request.talker)
    room = cfg.max_seq_len - prompt_len  # as the thinker does: the answer is cut, not refused
    if p.max_tokens > room:
        log.debug("request %s: talker frames capped at %d", seq.request.request_id, room)
        p = replace(p, max_tokens=room, min_tokens=min(p.min_tokens, room))
    seq.max_tokens, seq.sampled = p.max_tokens, 1
    if seq.text_done:
        bound_by_text(seq, cfg)
    return p


def codec_token_sampling(frames: Sampling) -> Sampling:
    """The talker's sampling in codebook-0 tokens for a request's, whose max_tokens and min_tokens
    count frames of audio.

    A frame's codebook-0 token is sampled one step before its other codebooks, so N frames take N + 1
    tokens: the step after the last frame samples one more, the end code or (at the frame limit) a
    token that is dropped, as in transformers' generate(). The end code may come once min_tokens
    frames are out; a request whose minimum is its maximum wants exactly that many frames, so it ends
    cut at its length, as a fixed-length thinker request does.
    """
    max_tokens = frames.max_tokens + 1
    min_tokens = max_tokens if frames.min_tokens >= frames.max_tokens else frames.min_tokens
    return replace(frames, max_tokens=max_tokens, min_tokens=min_tokens)


def bound_by_text(seq: TalkerSeq, cfg: TalkerStage) -> None:
    """Cap a request's frames by its complete text (`frames_per_text_token`, `extra_frames`), so a
    talker that never samples its end code stops about where its speech should; the cut ends the
    request with "length". While text still arrives the talker takes one text token per frame, so
    it is bounded by the thinker then. A request's own frame minimum still applies."""
    per = cfg.frames_per_text_token
    if per is None:
        return
    frames = math.ceil(per * len(seq.text)) + cfg.extra_frames
    limit = max(frames, seq.request.talker.min_tokens) + 1  # + 1: the last token never gets a frame
    # never below a token not yet queued: its step is what reads back the end
    seq.max_tokens = min(seq.max_tokens, max(limit, seq.sampled + 1))


def residual_draws(
    seqs: list[TalkerSeq], rows: int, groups: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniforms [R, G-1] for the code predictor's sampled codes, and which rows are greedy [R].

    As in transformers' generate(), the residual codes are sampled (top-k 50, top-p 0.8) when the
    talker samples and greedy when it does not. Each request draws from its own generator.
    """
    greedy = [s.request.talker.temperature <= 0 for s in seqs] + [True] * (rows - len(seqs))
    uniforms = np.zeros((rows, groups), dtype=np.float32)
    for b, s in enumerate(seqs):
        if not greedy[b]:
            if s.residual_rng is None:
                seed = s.request.talker.seed
                s.residual_rng = UniformDraws(
                    request_generator(None if seed is None else seed + 1), (groups,)
                )
            uniforms[b] = s.residual_rng.take()
    return to_device(torch.from_numpy(uniforms), device, torch.float32), to_device(greedy, device, torch.bool)
