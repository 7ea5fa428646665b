"""Talker runner: turns the thinker's streamed text into codec frames, one frame per step.

A request joins the batch as soon as its first assistant token arrives. Each step runs, for every
ready request at once, the code predictor (codebooks 1..15 of the previous frame) and one talker
decode (codebook 0 of the next frame), as transformers' generate() does one request at a time.

Every input of a step is on the device already: each slot's last codebook-0 token and hidden state
stay there, and sampling keeps its state there too (`SlotSampler`). So on a GPU a step is queued
without waiting for the one before it, and its frames and tokens are read back one step later
(`overlap`): the host's work on step n (routing frames, checking for the end) runs while the GPU
computes step n + 1. A request that samples its end token is therefore queued for one more step,
whose row is dropped; every other end (a frame limit, an abort) is known before a step is queued.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from omnivoice.config import PriorityConfig, TalkerStage
from omnivoice.messages import AudioStarted, CodecChunk, StageFinished, ThinkerChunk
from omnivoice.runners.code_predictor import CodePredictor
from omnivoice.runners.decode_step import DecodeStep, pad_rows
from omnivoice.runners.decoder import DecoderStack
from omnivoice.runners.graphs import StepGraphs
from omnivoice.runners.priority import Playback, PlaybackPolicy, Priority
from omnivoice.runners.slot_sampling import SlotSampler, request_generator
from omnivoice.runners.talker_inputs import TalkerInputs
from omnivoice.runners.transfer import ReadBack, to_device
from omnivoice.types import GenerationRequest, Sampling, StageStats

if TYPE_CHECKING:
    from omnivoice.models.loader import ModelSpec

log = logging.getLogger(__name__)


@dataclass
class _Seq:
    request: GenerationRequest
    user_part: torch.Tensor  # [U, Ht] projected user turns
    role_embeds: torch.Tensor  # [3, Hth] thinker embeddings of "<|im_start|>assistant\n"
    text: list[torch.Tensor] = field(default_factory=list)  # thinker embeddings of forwarded tokens
    text_done: bool = False
    slot: int = -1
    max_tokens: int = 0  # codebook-0 tokens it may sample (the last one never gets its frame)
    sampled: int = 0  # codebook-0 tokens queued so far (its prefill's, then one per step)
    step: int = 0  # transformers' generation_step: index into the trailing text
    frames: int = 0  # frames handed on
    playback: Playback = field(default_factory=Playback)  # its frames: those handed on
    residual_rng: torch.Generator | None = None  # the code predictor's draws
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
class _Step:
    """A queued step, as the host knows it; its results come back through `ReadBack`."""

    seqs: list[_Seq]
    counts: list[int]  # each row's codebook-0 tokens with this step's
    has_frames: bool  # results [n, G + 1]: each row's frame then its next token (a prefill: [n, 1])


class TalkerRunner:
    name = "talker"

    def __init__(
        self,
        talker: Any,
        tts_embeds: torch.Tensor,
        spec: ModelSpec,
        cfg: TalkerStage,
        device: torch.device,
        priority: PriorityConfig | None = None,
    ) -> None:
        self.model = talker
        self.spec = spec
        self.cfg = cfg
        self.device = device
        self.policy = PlaybackPolicy(priority or PriorityConfig(), 1.0 / spec.frame_rate)
        self.dtype = talker.dtype
        self.stack = DecoderStack(talker.model, multimodal_rope=True)
        if device.type == "cuda":
            self.stack.fuse(compile=cfg.compile, prefill=cfg.fused_prefill)
        self.talker_inputs = TalkerInputs(talker, tts_embeds, spec, device)
        self.codec_embed = self.talker_inputs.codec_embed
        self.cache = self.stack.make_cache(cfg.max_batch, cfg.max_seq_len, self.dtype, device)
        graphs = cfg.execution == "cuda_graph"
        self.predictor = CodePredictor(
            talker.code_predictor,
            cfg.max_batch,
            device,
            graphs,
            cfg.compile,
            cfg.predictor_kernels,
        )
        self.decode_step = DecodeStep(self.stack, self.cache, cfg.max_batch, device, graphs, "talker")
        slots = self.cache.scratch + 1
        vocab = talker.codec_head.out_features
        suppress = torch.tensor(spec.talker_suppressed_ids, dtype=torch.long)
        self.sampler = SlotSampler(slots, vocab, [spec.codec_eos_id], suppress, device)
        self.sample_graphs = StepGraphs(self._head_sample, "talker sampling", enabled=graphs)
        # each slot's last codebook-0 token and the talker's hidden state after it: the next step's input
        self.code0 = torch.zeros(slots, dtype=torch.long, device=device)
        self.hidden = torch.zeros(slots, self.talker_inputs.hidden_size, dtype=self.dtype, device=device)
        # read a step's results back after queuing the next one
        self.overlap = device.type == "cuda" if cfg.overlap is None else cfg.overlap
        self.seqs: dict[str, _Seq] = {}
        self._queued: ReadBack[_Step] = ReadBack()
        self._steps = 0
        self._last_batch = 0
        self._prefilled = False  # the last step prefilled prompts (its time is no decode step's)
        if graphs:
            self._capture_graphs()
        with torch.inference_mode():
            self.stack.warm_prefill(self.cache, self.dtype)

    # ---- StageRunner -------------------------------------------------------------------------
    def accept(self, msg: Any) -> list[Any]:
        if isinstance(msg, AudioStarted):
            if (started := self.seqs.get(msg.request_id)) is not None:
                started.playback.start(self.policy.clock())
            return []
        if not isinstance(msg, ThinkerChunk):
            raise TypeError(f"talker cannot take {type(msg).__name__}")
        seq = self.seqs.get(msg.request_id)
        if seq is None:
            if msg.request is None:
                return []  # a chunk of a request this stage already finished or aborted
            seq = self._new_seq(msg, msg.request)
            self.seqs[msg.request_id] = seq
        if msg.token_ids:
            seq.text.extend(self._t(msg.token_embeds))
        if msg.finished:
            seq.text_done = True
            if not seq.text and seq.slot < 0:
                # no assistant text reached the talker (a one-token answer): no audio
                self.seqs.pop(msg.request_id)
                return self._finish_outputs(seq, "stop")
            if seq.slot >= 0:
                self._bound_by_text(seq)
        return []

    def abort(self, request_id: str) -> None:
        seq = self.seqs.pop(request_id, None)
        if seq is not None and seq.slot >= 0:
            self._release(seq)

    def has_work(self) -> bool:
        if self._queued:
            return True  # results to read back
        return any(s.ready() and (s.slot >= 0 or self.cache.free_slots > 0) for s in self.seqs.values())

    def urgency(self) -> Priority | None:
        free = self.cache.free_slots > 0
        ready = [s.playback for s in self.seqs.values() if s.ready() and (s.slot >= 0 or free)]
        return self.policy.urgency(ready)

    def active_ids(self) -> list[str]:
        return [rid for rid, s in self.seqs.items() if s.slot >= 0]

    def stats(self) -> StageStats:
        queued = sum(1 for s in self.seqs.values() if s.slot < 0)
        running = len(self.seqs) - queued
        used = len(self.cache.lengths) - self.cache.free_slots
        return StageStats(
            self.name, queued, running, self._last_batch, self._steps, kv_slots_used=used,
            last_step_prefilled=self._prefilled,
        )  # fmt: skip

    @torch.inference_mode()
    def step(self, defer_ahead: bool = False) -> list[Any]:
        """One step: prefill the requests that start (in playback order, as slots allow), a frame of
        each running one (without the AHEAD ones when `defer_ahead`), read back what is due."""
        outs: list[Any] = []
        running = [s for s in self.seqs.values() if s.slot >= 0 and s.ready()]
        batch = self.policy.select(running, _playback, defer_ahead)
        starting = [s for s in self.seqs.values() if s.slot < 0 and s.ready()]
        starting = self.policy.order(starting, _playback)[: self.cache.free_slots]
        queued = len(self._queued)
        self._last_batch = 0  # the decode batch of this step (none: a step of prefills or read-backs)
        self._prefilled = False
        if starting:
            self._prefilled = True
            outs += self._prefill(starting)  # new requests together, in one forward
        if batch:
            self._decode(batch)
        self._steps += 1
        # with overlap, what was queued just now is read back on the next call, while the GPU runs it
        keep = len(self._queued) - queued if self.overlap else 0
        return outs + self._read_back(keep)

    # ---- internals ---------------------------------------------------------------------------
    def _t(self, a: np.ndarray) -> list[torch.Tensor]:
        return list(to_device(torch.from_numpy(np.asarray(a)), self.device, self.dtype))

    def _new_seq(self, msg: ThinkerChunk, request: GenerationRequest) -> _Seq:
        user_part, role_embeds = self.talker_inputs.user_part(msg)
        seq = _Seq(
            request=request, user_part=user_part, role_embeds=role_embeds, accepted_at=time.monotonic()
        )
        if request.prompt.image_grids:
            seq.rope, seq.rope_delta = self.talker_inputs.rope(
                request.prompt.input_ids, request.prompt.image_grids
            )
        return seq

    def _inputs(self, seq: _Seq) -> torch.Tensor:
        """The talker's prompt for a request [P, Ht]; ValueError if it leaves no room for a frame."""
        inputs = self.talker_inputs.prompt(seq.user_part, seq.role_embeds, seq.text[0], seq.request.voice)
        if inputs.shape[0] + 2 > self.cfg.max_seq_len:
            raise ValueError(
                f"talker context of {inputs.shape[0]} positions leaves no room for audio in its "
                f"max_seq_len of {self.cfg.max_seq_len}"
            )
        return inputs

    def _prefill(self, seqs: list[_Seq]) -> list[Any]:
        outs: list[Any] = []
        ready: list[tuple[_Seq, torch.Tensor]] = []
        for seq in seqs:
            try:
                ready.append((seq, self._inputs(seq)))
            except ValueError as e:  # this request cannot be spoken; the others go on
                rid = seq.request.request_id
                self.seqs.pop(rid, None)
                outs.append(StageFinished(rid, "talker", "error", error=f"talker: {e}"))
        if not ready:
            return outs
        lengths = [x.shape[0] for _, x in ready]
        longest = max(lengths)
        inputs = torch.stack(
            [torch.nn.functional.pad(x, (0, 0, 0, longest - x.shape[0])) for _, x in ready]
        )  # [B, P, Ht], right-padded
        params = []
        for seq, x in ready:
            seq.slot = self.cache.alloc()
            p = codec_token_sampling(seq.request.talker)
            room = self.cfg.max_seq_len - x.shape[0]  # as the thinker does: the answer is cut, not refused
            if p.max_tokens > room:
                log.debug("request %s: talker frames capped at %d", seq.request.request_id, room)
                p = replace(p, max_tokens=room, min_tokens=min(p.min_tokens, room))
            seq.max_tokens, seq.sampled = p.max_tokens, 1
            if seq.text_done:
                self._bound_by_text(seq)
            params.append(p)
        starting = [seq for seq, _ in ready]
        slots = [s.slot for s in starting]
        self.sampler.reset(slots, params, [()] * len(slots))
        for seq in starting:
            self.cache.rope_delta[seq.slot] = seq.rope_delta
        if any(seq.rope is not None for seq in starting):
            rope = _rope_rows(starting, lengths, longest).to(inputs.device)
            h, _ = self.stack.forward(inputs, self.cache, slots, [0] * len(ready), (), lengths, rope)
        else:
            h, _ = self.stack.prefill(inputs, self.cache, slots, [0] * len(ready), lengths=lengths)
        last = h[torch.arange(len(ready), device=h.device), to_device(lengths, h.device) - 1]
        slot_idx = to_device(slots, self.device)
        (tokens,) = self._head_sample(last, slot_idx, self.sampler.draws(slots, len(slots)))
        self.code0[slot_idx] = tokens
        self.hidden[slot_idx] = last
        self._queue(starting, tokens[:, None], has_frames=False)
        return outs

    def _decode(self, seqs: list[_Seq]) -> None:
        """Queue one step of the batch: the frame of each row's last token, and its next token."""
        n = len(seqs)
        rows = self.decode_step.rows(n)  # padded to a batch bucket on the GPU
        slots = [s.slot for s in seqs]
        slot_idx = self.decode_step.slot_index(slots)
        code0 = self.code0[slot_idx]  # [R]
        code0_embed = self.codec_embed(code0)
        uniforms, greedy = self._residual_draws(seqs, rows)
        hidden = self.hidden[slot_idx]
        residual, residual_embeds = self.predictor.predict(hidden, code0_embed, uniforms, greedy)
        summed = torch.cat([code0_embed[:, None], residual_embeds], dim=1).sum(1)  # [R, Ht]
        inputs = summed + pad_rows(self.talker_inputs.trailing([(s.text, s.step) for s in seqs]), rows)
        h, _ = self.decode_step(inputs[:, None], slots, slot_idx)  # [n, Ht]
        draws = self.sampler.draws(slots, rows)
        (tokens,) = self.sample_graphs(rows, {"hidden": pad_rows(h, rows), "slot_idx": slot_idx, "u": draws})
        self.code0[slot_idx[:n]] = tokens[:n]
        self.hidden[slot_idx[:n]] = h
        for s in seqs:
            s.step += 1
            s.sampled += 1
        self._last_batch = n
        out = torch.cat([code0[:n, None], residual[:n], tokens[:n, None]], dim=1)  # [n, G + 1]
        self._queue(seqs, out, has_frames=True)

    def _bound_by_text(self, seq: _Seq) -> None:
        """Cap a request's frames by its complete text (`frames_per_text_token`, `extra_frames`), so a
        talker that never samples its end code stops about where its speech should; the cut ends the
        request with "length". While text still arrives the talker takes one text token per frame, so
        it is bounded by the thinker then. A request's own frame minimum still applies."""
        per = self.cfg.frames_per_text_token
        if per is None:
            return
        frames = math.ceil(per * len(seq.text)) + self.cfg.extra_frames
        limit = max(frames, seq.request.talker.min_tokens) + 1  # + 1: the last token never gets a frame
        # never below a token not yet queued: its step is what reads back the end
        seq.max_tokens = min(seq.max_tokens, max(limit, seq.sampled + 1))

    def _head_sample(
        self, hidden: torch.Tensor, slot_idx: torch.Tensor, u: torch.Tensor
    ) -> tuple[torch.Tensor]:
        """hidden [R, Ht] -> each row's next codebook-0 token [R], recorded in its slot's sampler."""
        return (self.sampler.sample(self.model.codec_head(hidden), slot_idx, u),)

    def _queue(self, seqs: list[_Seq], out: torch.Tensor, has_frames: bool) -> None:
        self._queued.put(_Step(seqs, [s.sampled for s in seqs], has_frames), out)

    def _read_back(self, keep: int) -> list[Any]:
        """Hand on the frames of every queued step but the last `keep`, and end the requests whose
        last token they hold."""
        outs: list[Any] = []
        for q, results in self._queued.take(keep):
            out = results.numpy()
            made = time.monotonic()
            for b, s in enumerate(q.seqs):
                rid = s.request.request_id
                if self.seqs.get(rid) is not s:
                    continue  # ended (its end token was in an earlier step) or aborted since
                if q.has_frames:
                    s.frames += 1
                    s.playback.frames = s.frames
                    first = s.frames == 1
                    accepted = s.accepted_at if first else 0.0
                    outs.append(CodecChunk(rid, out[b, :-1, None].copy(), False, first, made, accepted))
                token = int(out[b, -1])
                reason = None
                if token in self.sampler.end_ids:
                    reason = "stop"
                elif q.counts[b] >= s.max_tokens:
                    reason = "length"  # the last codebook-0 token never gets its frame, as in transformers
                if reason is not None:
                    self.seqs.pop(rid, None)
                    self._release(s)
                    outs += self._finish_outputs(s, reason)
        return outs

    def _release(self, seq: _Seq) -> None:
        self.cache.release(seq.slot)
        self.sampler.release(seq.slot)

    def _residual_draws(self, seqs: list[_Seq], rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Uniforms [R, G-1] for the code predictor's sampled codes, and which rows are greedy [R].

        As in transformers' generate(), the residual codes are sampled (top-k 50, top-p 0.8) when the
        talker samples and greedy when it does not. Each request draws from its own generator.
        """
        greedy = [s.request.talker.temperature <= 0 for s in seqs] + [True] * (rows - len(seqs))
        groups = self.spec.num_code_groups - 1
        uniforms = torch.zeros(rows, groups)
        for b, s in enumerate(seqs):
            if not greedy[b]:
                if s.residual_rng is None:
                    seed = s.request.talker.seed
                    s.residual_rng = request_generator(None if seed is None else seed + 1)
                uniforms[b] = torch.rand(groups, generator=s.residual_rng)
        return to_device(uniforms, self.device, torch.float32), to_device(greedy, self.device, torch.bool)

    @torch.inference_mode()
    def _capture_graphs(self) -> None:
        """Capture the decode, code-predictor and sampling graphs of every batch bucket before serving."""
        ht = self.talker_inputs.hidden_size
        self.decode_step.capture_all(ht, self.dtype)
        began = time.perf_counter()
        groups = self.spec.num_code_groups - 1
        for rows in self.decode_step.batch_sizes:
            zeros = torch.zeros(rows, ht, dtype=self.dtype, device=self.device)
            uniforms = torch.zeros(rows, groups, device=self.device)
            self.predictor.predict(
                zeros, zeros, uniforms, torch.ones(rows, dtype=torch.bool, device=self.device)
            )
            # padding rows only: the capture's warm-up runs record tokens in the scratch slot alone
            scratch = torch.full((rows,), self.cache.scratch, dtype=torch.long, device=self.device)
            self.sample_graphs(rows, {"hidden": zeros, "slot_idx": scratch, "u": uniforms[:, 0]})
        log.info(
            "code predictor and sampling: %d CUDA graphs captured in %.1f s",
            len(self.predictor.run.captured) + len(self.sample_graphs.captured),
            time.perf_counter() - began,
        )

    def _finish_outputs(self, seq: _Seq, reason: str) -> list[Any]:
        rid = seq.request.request_id
        empty = np.zeros((self.spec.num_code_groups, 0), dtype=np.int64)
        return [CodecChunk(rid, empty, True), StageFinished(rid, "talker", reason, seq.frames)]


def _playback(seq: _Seq) -> Playback:
    return seq.playback


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


def _rope_rows(seqs: list[_Seq], lengths: list[int], t: int) -> torch.Tensor:
    """A prefill batch's rotary positions [3, B, t]: a prompt without images at its cache positions;
    the padding repeats its row's last."""
    rows = []
    for seq, n in zip(seqs, lengths, strict=True):
        rope = seq.rope[:, :n] if seq.rope is not None else torch.arange(n).expand(3, -1)
        rows.append(torch.cat([rope, rope[:, -1:].expand(3, t - n)], dim=1))
    return torch.stack(rows, dim=1)
