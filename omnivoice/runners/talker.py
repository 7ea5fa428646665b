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

A request's bookkeeping, the sampling it runs with and the code predictor's draws are
`talker_seq.py`'s; a starting request's prompt and the batched prefill's forward are
`talker_prefill.py`'s; what a step read back becomes is `talker_outputs.py`'s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from omnivoice.config import PriorityConfig, TalkerStage
from omnivoice.messages import AudioStarted, StageFinished, ThinkerChunk
from omnivoice.runners.code_predictor import CodePredictor
from omnivoice.runners.decode_step import DecodeStep, pad_rows
from omnivoice.runners.decoder import DecoderStack
from omnivoice.runners.graph_backlog import GraphBacklog
from omnivoice.runners.graphs import StepGraphs
from omnivoice.runners.priority import Playback, PlaybackPolicy, Priority
from omnivoice.runners.slot_sampling import SlotSampler
from omnivoice.runners.start_steps import StartSteps
from omnivoice.runners.talker_inputs import TalkerInputs
from omnivoice.runners.talker_outputs import FrameReader
from omnivoice.runners.talker_prefill import forward_prefill, prompt_inputs
from omnivoice.runners.talker_seq import (
    QueuedStep,
    TalkerSeq,
    bound_by_text,
    codec_token_sampling,
    residual_draws,
    start_seq,
)
from omnivoice.runners.transfer import ReadBack, to_device
from omnivoice.types import GenerationRequest, StageStats

if TYPE_CHECKING:
    from omnivoice.models.loader import ModelSpec

log = logging.getLogger(__name__)


# importable from here as well: the transformers baseline counts a request's frames as the talker does
__all__ = ["TalkerRunner", "codec_token_sampling"]


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
        start: StartSteps | None = None,
    ) -> None:
        """`start`: where the steps of the build are timed."""
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
        self.seqs: dict[str, TalkerSeq] = {}
        # the requests this step is prefilling, until it is done: a step failing there fails these (the
        # running rows' decode had not run), whether or not they had a slot yet
        self._starting: list[str] = []
        self._queued: ReadBack[QueuedStep] = ReadBack()
        self.reader = FrameReader(self.sampler, spec.num_code_groups)
        self._steps = 0
        self._last_batch = 0
        self._prefilled = False  # the last step prefilled prompts (its time is no decode step's)
        self.graph_backlog = GraphBacklog(self.name)  # graphs of wide batches captured once serving
        steps = start or StartSteps(self.name)
        if graphs:
            with steps.step("graphs"):
                self._capture_graphs()
        if self.stack.compiles_prefill:
            with steps.step("prefill compile"), torch.inference_mode():
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
            # host rows, copied out of the message: a step's inputs go to the device together
            seq.text.extend(np.array(msg.token_embeds))
        if msg.finished:
            seq.text_done = True
            if not seq.text and seq.slot < 0:
                # no assistant text reached the talker (a one-token answer): no audio
                self.seqs.pop(msg.request_id)
                return self.reader.finish(seq, "stop")
            if seq.slot >= 0:
                bound_by_text(seq, self.cfg)
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
        if self._starting:
            return list(self._starting)
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
        self._starting = []
        running = [s for s in self.seqs.values() if s.slot >= 0 and s.ready()]
        batch = self.policy.select(running, _playback, defer_ahead)
        starting = [s for s in self.seqs.values() if s.slot < 0 and s.ready()]
        starting = self.policy.order(starting, _playback)[: self.cache.free_slots]
        queued = len(self._queued)
        self._last_batch = 0  # the decode batch of this step (none: a step of prefills or read-backs)
        self._prefilled = False
        if starting:
            self._prefilled = True
            self._starting = [s.request.request_id for s in starting]
            outs += self._prefill(starting)  # new requests together, in one forward
            self._starting = []
        if batch:
            self._decode(batch)
        self._steps += 1
        # with overlap, what was queued just now is read back on the next call, while the GPU runs it
        keep = len(self._queued) - queued if self.overlap else 0
        return outs + self._read_back(keep)

    # ---- internals ---------------------------------------------------------------------------
    def _new_seq(self, msg: ThinkerChunk, request: GenerationRequest) -> TalkerSeq:
        user_part, role_embeds = self.talker_inputs.user_part(msg)
        seq = TalkerSeq(
            request=request, user_part=user_part, role_embeds=role_embeds, accepted_at=time.monotonic()
        )
        if request.prompt.image_grids:
            seq.rope, seq.rope_delta = self.talker_inputs.rope(
                request.prompt.input_ids, request.prompt.image_grids
            )
        return seq

    def _prefill(self, seqs: list[TalkerSeq]) -> list[Any]:
        """Prefill the starting requests together, book each in a slot and queue its first codebook-0
        token; a request whose prompt leaves no room for audio ends with an error, the others go on."""
        outs: list[Any] = []
        starting: list[TalkerSeq] = []
        prompts: list[torch.Tensor] = []
        for seq in seqs:
            try:
                prompts.append(prompt_inputs(self.talker_inputs, seq, self.cfg.max_seq_len))
            except ValueError as e:  # this request cannot be spoken; the others go on
                rid = seq.request.request_id
                self.seqs.pop(rid, None)
                outs.append(StageFinished(rid, "talker", "error", error=f"talker: {e}"))
                continue
            starting.append(seq)
        if not starting:
            return outs
        params = [
            start_seq(seq, self.cache.alloc(), x.shape[0], self.cfg)
            for seq, x in zip(starting, prompts, strict=True)
        ]
        slots = [s.slot for s in starting]
        self.sampler.reset(slots, params, [()] * len(slots))
        last = forward_prefill(self.stack, self.cache, starting, prompts)  # [B, Ht]
        slot_idx = to_device(slots, self.device)
        (tokens,) = self._head_sample(last, slot_idx, self.sampler.draws(slots, len(slots)))
        self.code0[slot_idx] = tokens
        self.hidden[slot_idx] = last
        self._queue(starting, tokens[:, None], has_frames=False)
        return outs

    def _decode(self, seqs: list[TalkerSeq]) -> None:
        """Queue one step of the batch: the frame of each row's last token, and its next token."""
        n = len(seqs)
        rows = self.decode_step.rows(n)  # padded to a batch bucket on the GPU
        slots = [s.slot for s in seqs]
        slot_idx = self.decode_step.slot_index(slots)
        code0 = self.code0[slot_idx]  # [R]
        code0_embed = self.codec_embed(code0)
        uniforms, greedy = residual_draws(seqs, rows, self.spec.num_code_groups - 1, self.device)
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

    def _head_sample(
        self, hidden: torch.Tensor, slot_idx: torch.Tensor, u: torch.Tensor
    ) -> tuple[torch.Tensor]:
        """hidden [R, Ht] -> each row's next codebook-0 token [R], recorded in its slot's sampler."""
        return (self.sampler.sample(self.model.codec_head(hidden), slot_idx, u),)

    def _queue(self, seqs: list[TalkerSeq], out: torch.Tensor, has_frames: bool) -> None:
        self._queued.put(QueuedStep(seqs, [s.sampled for s in seqs], has_frames), out)

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
                reason = self.reader.read(s, out[b], q.counts[b], q.has_frames, made, outs)
                if reason is not None:
                    self.seqs.pop(rid, None)
                    self._release(s)
                    outs += self.reader.finish(s, reason)
        return outs

    def _release(self, seq: TalkerSeq) -> None:
        self.cache.release(seq.slot)
        self.sampler.release(seq.slot)

    @torch.inference_mode()
    def _capture_graphs(self) -> None:
        """Capture the decode, code-predictor and sampling graphs of every batch bucket before serving,
        or of those up to `graphs_at_start` rows, the wider ones left in `graph_backlog`."""
        ht, widest = self.talker_inputs.hidden_size, self.cfg.graphs_at_start
        self.decode_step.capture_all(ht, self.dtype, widest, self.graph_backlog)
        began = time.perf_counter()
        for rows in self.decode_step.batch_sizes:
            predictor = (self.predictor.run, self._predictor_capturer(rows))
            sampling = (self.sample_graphs, self._sampling_capturer(rows))
            for graphs, capture in (predictor, sampling):
                if widest is not None and rows > widest:
                    self.graph_backlog.add(graphs, rows, capture)
                else:
                    capture()
        log.info(
            "code predictor and sampling: %d CUDA graphs captured in %.1f s",
            len(self.predictor.run.captured) + len(self.sample_graphs.captured),
            time.perf_counter() - began,
        )

    def _predictor_capturer(self, rows: int) -> Callable[[], object]:
        """A call that captures the code predictor's frame graph of `rows` from padding rows."""

        def capture() -> object:
            with torch.inference_mode():
                zeros = torch.zeros(
                    rows, self.talker_inputs.hidden_size, dtype=self.dtype, device=self.device
                )
                uniforms = torch.zeros(rows, self.spec.num_code_groups - 1, device=self.device)
                greedy = torch.ones(rows, dtype=torch.bool, device=self.device)
                return self.predictor.predict(zeros, zeros, uniforms, greedy)

        return capture

    def _sampling_capturer(self, rows: int) -> Callable[[], object]:
        """A call that captures the codebook-0 sampling graph of `rows` from padding rows."""

        def capture() -> object:
            with torch.inference_mode():
                zeros = torch.zeros(
                    rows, self.talker_inputs.hidden_size, dtype=self.dtype, device=self.device
                )
                # padding rows only: the capture's warm-up runs record tokens in the scratch slot alone
                scratch = torch.full((rows,), self.cache.scratch, dtype=torch.long, device=self.device)
                u = torch.zeros(rows, device=self.device)
                return self.sample_graphs(rows, {"hidden": zeros, "slot_idx": scratch, "u": u})

        return capture


def _playback(seq: TalkerSeq) -> Playback:
    return seq.playback
