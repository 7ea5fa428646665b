"""What a talker step read back from the device becomes: each row's frame of codes, handed on to
Code2Wav, and the request's end (its end code sampled, or its codebook-0 token limit reached), with
the empty final chunk that closes its stream.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from omnivoice.messages import CodecChunk, StageFinished
from omnivoice.runners.slot_sampling import SlotSampler
from omnivoice.runners.talker_seq import TalkerSeq


class FrameReader:
    """Turns each read-back row of a running request into its frame, and says when it ends it."""

    def __init__(self, sampler: SlotSampler, num_code_groups: int) -> None:
        self.sampler = sampler
        self.num_code_groups = num_code_groups

    def read(
        self, seq: TalkerSeq, row: np.ndarray, count: int, has_frames: bool, made: float, outs: list[Any]
    ) -> str | None:
        """Book `seq`'s row of a step (`row` [G + 1]: its frame then its next codebook-0 token, or [1]
        the token alone after a prefill; `count` its tokens with this one; `made` when it was read
        back) and add its frame to `outs`. The reason the request ends with, or None."""
        if has_frames:
            seq.frames += 1
            seq.playback.frames = seq.frames
            first = seq.frames == 1
            accepted = seq.accepted_at if first else 0.0
            rid = seq.request.request_id
            outs.append(CodecChunk(rid, row[:-1, None].copy(), False, first, made, accepted))
        if int(row[-1]) in self.sampler.end_ids:
            return "stop"
        if count >= seq.max_tokens:
            return "length"  # the last codebook-0 token never gets its frame, as in transformers
        return None

    def finish(self, seq: TalkerSeq, reason: str) -> list[Any]:
        """The outputs that end a request: an empty final chunk, then the stage's finish."""
        rid = seq.request.request_id
        empty = np.zeros((self.num_code_groups, 0), dtype=np.int64)
        return [CodecChunk(rid, empty, True), StageFinished(rid, "talker", reason, seq.frames)]
