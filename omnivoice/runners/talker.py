"""Talker runner: turns the thinker's streamed text into codec frames, one frame per step.

A request joins the batch as soon as its first assistant token arrives. Each step runs, for every
ready request at once, the code predictor (codebooks 1..15 of the previous frame) and one talker
decode (codebook 0 of the next frame), as transformers' generate() does one request at a time.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from omnivoice.config import StageConfig
from omnivoice.engine.chunks import CodecChunk, StageFinished, ThinkerChunk
from omnivoice.engine.types import GenerationRequest, StageStats
from omnivoice.runners.code_predictor import CodePredictor
from omnivoice.runners.decode_step import DecodeStep, pad_rows
from omnivoice.runners.decoder import DecoderStack
from omnivoice.runners.sampling import RequestSampler, sample_rows
from omnivoice.runners.transfer import to_device

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
    sampler: RequestSampler | None = None
    step: int = 0  # transformers' generation_step: index into the trailing text
    code0: int = -1
    hidden: torch.Tensor | None = None  # [Ht] talker's last hidden state
    frames: int = 0
    residual_rng: torch.Generator | None = None  # the code predictor's draws

    def ready(self) -> bool:
        if self.slot < 0:
            return len(self.text) >= 1
        return self.step + 1 < len(self.text) or self.text_done


class TalkerRunner:
    name = "talker"

    def __init__(
        self, talker: Any, tts_embeds: torch.Tensor, spec: ModelSpec, cfg: StageConfig, device: torch.device
    ) -> None:
        self.model = talker
        self.spec = spec
        self.cfg = cfg
        self.device = device
        self.dtype = talker.dtype
        self.stack = DecoderStack(talker.model, multimodal_rope=True)
        if device.type == "cuda":
            self.stack.fuse(compile=cfg.compile)
        self.codec_embed = talker.get_input_embeddings()
        self.cache = self.stack.make_cache(cfg.max_batch, cfg.max_seq_len, self.dtype, device)
        graphs = cfg.execution == "cuda_graph"
        self.predictor = CodePredictor(talker.code_predictor, cfg.max_batch, device, graphs, cfg.compile)
        self.decode_step = DecodeStep(self.stack, self.cache, cfg.max_batch, device, graphs, "talker")
        # [3, Ht]: text_projection of the thinker's tts_bos / tts_eos / tts_pad embeddings
        self.tts_bos, self.tts_eos, self.tts_pad = talker.text_projection(tts_embeds.to(device, self.dtype))
        self.suppress = torch.tensor(spec.talker_suppressed_ids, device=device)
        self.seqs: dict[str, _Seq] = {}
        self._steps = 0
        self._last_batch = 0
        if graphs:
            self._capture_graphs()

    # ---- StageRunner -------------------------------------------------------------------------
    def accept(self, msg: Any) -> list[Any]:
        if not isinstance(msg, ThinkerChunk):
            raise TypeError(f"talker cannot take {type(msg).__name__}")
        seq = self.seqs.get(msg.request_id)
        if seq is None:
            if msg.request is None:
                return []  # a chunk of a request this stage already finished or aborted
            seq = self._new_seq(msg)
            self.seqs[msg.request_id] = seq
        if msg.token_ids:
            seq.text.extend(self._t(msg.token_embeds))
        if msg.finished:
            seq.text_done = True
            if not seq.text and seq.slot < 0:
                # no assistant text reached the talker (a one-token answer): no audio
                self.seqs.pop(msg.request_id)
                return self._finish_outputs(seq, "stop")
        return []

    def abort(self, request_id: str) -> None:
        seq = self.seqs.pop(request_id, None)
        if seq is not None and seq.slot >= 0:
            self.cache.release(seq.slot)

    def has_work(self) -> bool:
        return any(s.ready() and (s.slot >= 0 or self.cache.free_slots > 0) for s in self.seqs.values())

    def active_ids(self) -> list[str]:
        return [rid for rid, s in self.seqs.items() if s.slot >= 0]

    def stats(self) -> StageStats:
        queued = sum(1 for s in self.seqs.values() if s.slot < 0)
        running = len(self.seqs) - queued
        used = len(self.cache.lengths) - self.cache.free_slots
        return StageStats(self.name, queued, running, self._last_batch, self._steps, kv_slots_used=used)

    @torch.inference_mode()
    def step(self) -> list[Any]:
        outs: list[Any] = []
        batch = [s for s in self.seqs.values() if s.slot >= 0 and s.ready()]
        starting = [s for s in self.seqs.values() if s.slot < 0 and s.ready()][: self.cache.free_slots]
        if starting:
            outs += self._prefill(starting)  # new requests together, in one forward
        if batch:
            outs += self._decode(batch)
        self._steps += 1
        return outs

    # ---- internals ---------------------------------------------------------------------------
    def _t(self, a: np.ndarray) -> list[torch.Tensor]:
        return list(to_device(torch.from_numpy(np.asarray(a)), self.device, self.dtype))

    def _new_seq(self, msg: ThinkerChunk) -> _Seq:
        ids = to_device(msg.prompt_ids, self.device)
        embeds = to_device(torch.from_numpy(msg.prompt_embeds), self.device, self.dtype)  # [T, Hth]
        hidden = to_device(torch.from_numpy(msg.prompt_hidden), self.device, self.dtype)  # [T, Hth]
        user = _user_positions(ids, self.spec)
        mm = user & _multimodal_positions(ids, self.spec)
        part = torch.empty(int(user.sum()), self.tts_pad.shape[-1], device=self.device, dtype=self.dtype)
        sel_mm = mm[user]
        if bool(sel_mm.any()):
            part[sel_mm] = self.model.hidden_projection(hidden[mm])
        if bool((~sel_mm).any()):
            part[~sel_mm] = self.model.text_projection(embeds[user & ~mm])
        return _Seq(request=msg.request, user_part=part, role_embeds=embeds[-3:])

    def _inputs(self, seq: _Seq) -> torch.Tensor:
        """The talker's prompt for a request: its user turns, then the assistant start. [P, Ht]"""
        spec, req = self.spec, seq.request
        assistant = self.model.text_projection(torch.stack([*seq.role_embeds, seq.text[0]]))  # [4, Ht]
        text_part = torch.cat([assistant[:3], self.tts_pad.expand(4, -1), self.tts_bos[None], assistant[3:4]])
        voice = spec.speaker_id(req.voice)
        codec_ids = [
            spec.codec_nothink_id,
            spec.codec_think_bos_id,
            spec.codec_think_eos_id,
            voice,
            spec.codec_pad_id,
            spec.codec_bos_id,
        ]
        codec_part = torch.cat(
            [
                torch.zeros(3, text_part.shape[-1], device=self.device, dtype=self.dtype),
                self.codec_embed(to_device(codec_ids, self.device)),
            ]
        )
        inputs = torch.cat([seq.user_part, text_part + codec_part])  # TALKER_PROMPT_EXTRA
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
        for seq, x in ready:
            seq.slot = self.cache.alloc()
            params = seq.request.talker
            room = self.cfg.max_seq_len - x.shape[0]  # as the thinker does: the answer is cut, not refused
            if params.max_tokens > room:
                log.debug("request %s: talker frames capped at %d", seq.request.request_id, room)
                params = replace(params, max_tokens=room, min_tokens=min(params.min_tokens, room))
            seq.sampler = RequestSampler(params, [self.spec.codec_eos_id], suppress=self.suppress)
        starting = [seq for seq, _ in ready]
        h, _ = self.stack.forward(
            inputs, self.cache, [s.slot for s in starting], [0] * len(ready), lengths=lengths
        )
        last = h[torch.arange(len(ready), device=h.device), to_device(lengths, h.device) - 1]
        return outs + self._sample(starting, last)

    def _decode(self, seqs: list[_Seq]) -> list[Any]:
        n = len(seqs)
        rows = self.decode_step.rows(n)  # padded to a batch bucket on the GPU
        code0 = to_device([s.code0 for s in seqs] + [0] * (rows - n), self.device)
        hidden = pad_rows(torch.stack([s.hidden for s in seqs]), rows)  # [R, Ht]
        code0_embed = self.codec_embed(code0)
        uniforms, greedy = self._residual_draws(seqs, rows)
        residual, residual_embeds = self.predictor.predict(hidden, code0_embed, uniforms, greedy)
        frames = torch.cat([code0[:n, None], residual[:n]], dim=1)  # [B, G]
        summed = torch.cat([code0_embed[:, None], residual_embeds], dim=1).sum(1)  # [R, Ht]
        inputs = summed + pad_rows(self._trailing(seqs), rows)
        h, _ = self.decode_step(inputs[:, None], [s.slot for s in seqs])
        outs: list[Any] = []
        frames_np = frames.cpu().numpy()
        for b, s in enumerate(seqs):
            s.step += 1
            s.frames += 1
            outs.append(CodecChunk(s.request.request_id, frames_np[b][:, None], False, first=s.frames == 1))
        self._last_batch = n
        return outs + self._sample(seqs, h)

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
                    s.residual_rng = torch.Generator()
                    if s.request.talker.seed is None:
                        s.residual_rng.seed()
                    else:
                        s.residual_rng.manual_seed(s.request.talker.seed + 1)
                uniforms[b] = torch.rand(groups, generator=s.residual_rng)
        return to_device(uniforms, self.device, torch.float32), to_device(greedy, self.device, torch.bool)

    @torch.inference_mode()
    def _capture_graphs(self) -> None:
        """Capture the decode and code-predictor graphs of every batch bucket before serving."""
        ht = self.tts_pad.shape[-1]
        self.decode_step.capture_all(ht, self.dtype)
        began = time.perf_counter()
        groups = self.spec.num_code_groups - 1
        for rows in self.decode_step.batch_sizes:
            zeros = torch.zeros(rows, ht, dtype=self.dtype, device=self.device)
            uniforms = torch.zeros(rows, groups, device=self.device)
            self.predictor.predict(
                zeros, zeros, uniforms, torch.ones(rows, dtype=torch.bool, device=self.device)
            )
        log.info(
            "code predictor: %d CUDA graphs captured in %.1f s",
            len(self.predictor.run.captured),
            time.perf_counter() - began,
        )

    def _trailing(self, seqs: list[_Seq]) -> torch.Tensor:
        """[B, Ht]: each row's next trailing text embedding (projected text, then tts_eos, then tts_pad)."""
        rows: list[torch.Tensor | None] = []
        texts: list[torch.Tensor] = []
        for s in seqs:
            j = s.step + 1  # trailing_text_hidden[step] is the projection of forwarded token step + 1
            if j < len(s.text):
                texts.append(s.text[j])
                rows.append(None)
            else:
                rows.append(self.tts_eos if j == len(s.text) else self.tts_pad)
        projected = iter(self.model.text_projection(torch.stack(texts)) if texts else ())
        return torch.stack([next(projected) if r is None else r for r in rows])

    def _sample(self, seqs: list[_Seq], hidden: torch.Tensor) -> list[Any]:
        logits = self.model.codec_head(hidden)  # [B, V]
        samplers = [s.sampler for s in seqs]
        assert all(smp is not None for smp in samplers)
        tokens = sample_rows(samplers, logits).tolist()  # type: ignore[arg-type]  # the step's one sync
        outs: list[Any] = []
        for b, s in enumerate(seqs):
            assert s.sampler is not None
            token = tokens[b]
            s.sampler.record(token)
            s.code0, s.hidden = token, hidden[b]
            reason = None
            if s.sampler.is_end(token):
                reason = "stop"
            elif s.sampler.generated >= s.sampler.params.max_tokens:
                reason = "length"  # the last codebook-0 token never gets its frame, as in transformers
            if reason is not None:
                self.seqs.pop(s.request.request_id, None)
                self.cache.release(s.slot)
                outs += self._finish_outputs(s, reason)
        return outs

    def _finish_outputs(self, seq: _Seq, reason: str) -> list[Any]:
        rid = seq.request.request_id
        empty = np.zeros((self.spec.num_code_groups, 0), dtype=np.int64)
        return [CodecChunk(rid, empty, True), StageFinished(rid, "talker", reason, seq.frames)]


def _user_positions(ids: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    """Positions inside user turns: from a user turn's <|im_start|> up to the next <|im_start|>."""
    pos = torch.arange(ids.shape[0], device=ids.device)
    starts = torch.where(ids == spec.im_start_id, pos, torch.full_like(pos, -1))
    prev = torch.cummax(starts, dim=0).values.clamp_min(0)
    role = ids[(prev + 1).clamp_max(ids.shape[0] - 1)]
    return role == spec.user_id


def _multimodal_positions(ids: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    # prompts carry audio only (images and video are not accepted), so audio placeholders are all
    return ids == spec.audio_pad_id
