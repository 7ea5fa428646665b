"""Thinker runner: prefill new requests, decode the running batch, stream what the talker needs."""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from omnivoice.config import StageConfig
from omnivoice.engine.chunks import NewRequest, StageFinished, ThinkerChunk, TokenOutput
from omnivoice.engine.types import GenerationRequest, StageStats
from omnivoice.runners.decoder import DecoderStack
from omnivoice.runners.sampling import RequestSampler

if TYPE_CHECKING:
    from omnivoice.models.loader import ModelSpec

log = logging.getLogger(__name__)


@dataclass
class _Seq:
    request: GenerationRequest
    slot: int
    sampler: RequestSampler
    prompt_len: int
    last_token: int = -1
    generated: list[int] = field(default_factory=list)


class ThinkerRunner:
    name = "thinker"

    def __init__(self, thinker: Any, spec: ModelSpec, cfg: StageConfig, device: torch.device) -> None:
        self.model = thinker
        self.spec = spec
        self.cfg = cfg
        self.device = device
        # transformers 5.2x wraps the text model as `model.language_model`; 5.17 (the H200 image) does not
        text_model = thinker.model.language_model if hasattr(thinker.model, "language_model") else thinker.model
        self.stack = DecoderStack(text_model, multimodal_rope=True)
        self.embed = thinker.get_input_embeddings()
        self.cache = self.stack.make_cache(cfg.max_batch, cfg.max_seq_len, thinker.dtype, device)
        self.waiting: deque[GenerationRequest] = deque()
        self.running: dict[str, _Seq] = {}
        self._steps = 0
        self._last_batch = 0

    # ---- StageRunner -------------------------------------------------------------------------
    def accept(self, msg: Any) -> list[Any]:
        if not isinstance(msg, NewRequest):
            raise TypeError(f"thinker cannot take {type(msg).__name__}")
        req = msg.request
        n = len(req.prompt.input_ids)
        if n == 0 or n >= self.cfg.max_seq_len:
            raise ValueError(f"prompt of {n} tokens does not fit the context of {self.cfg.max_seq_len}")
        self.waiting.append(req)
        return []

    def abort(self, request_id: str) -> None:
        self.waiting = deque(r for r in self.waiting if r.request_id != request_id)
        seq = self.running.pop(request_id, None)
        if seq is not None:
            self.cache.release(seq.slot)

    def has_work(self) -> bool:
        return bool(self.running) or (bool(self.waiting) and self.cache.free_slots > 0)

    def active_ids(self) -> list[str]:
        return list(self.running)

    def stats(self) -> StageStats:
        return StageStats(self.name, len(self.waiting), len(self.running), self._last_batch, self._steps)

    @torch.inference_mode()
    def step(self) -> list[Any]:
        outs: list[Any] = []
        decoding = list(self.running.values())
        # Admit new requests first: their first token is on the time-to-first-audio path.
        while self.waiting and self.cache.free_slots > 0:
            outs += self._prefill(self.waiting.popleft())
        if decoding:
            outs += self._decode(decoding)
        self._steps += 1
        return outs

    # ---- internals ---------------------------------------------------------------------------
    def _prefill(self, req: GenerationRequest) -> list[Any]:
        ids = torch.tensor([req.prompt.input_ids], device=self.device)  # [1, T]
        embeds = self.embed(ids)  # [1, T, H]
        if req.prompt.audio_features:
            embeds = self._merge_audio(ids, embeds, req.prompt.audio_features)
        slot = self.cache.alloc()
        max_new = min(req.thinker.max_tokens, self.cfg.max_seq_len - ids.shape[1])
        params = req.thinker if max_new == req.thinker.max_tokens else _with_max(req.thinker, max_new)
        sampler = RequestSampler(params, self.spec.thinker_eos_ids, history=req.prompt.input_ids)
        seq = _Seq(req, slot, sampler, prompt_len=ids.shape[1])
        self.running[req.request_id] = seq
        accept = self.spec.accept_hidden_layer
        h, kept = self.stack.forward(embeds, self.cache, [slot], [0], keep=(0, accept))
        logits = self.model.lm_head(h[:, -1])  # [1, V]
        first = ThinkerChunk(
            request_id=req.request_id,
            token_ids=(),
            token_embeds=None,
            finished=False,
            prompt_ids=req.prompt.input_ids,
            prompt_embeds=_np(kept[0][0]),
            prompt_hidden=_np(kept[accept][0]),
            request=req,
        )
        return self._emit([seq], logits, first_chunk={req.request_id: first})

    def _merge_audio(
        self, ids: torch.Tensor, embeds: torch.Tensor, feats: tuple[np.ndarray, ...]
    ) -> torch.Tensor:
        lengths = [f.shape[1] for f in feats]
        batch = torch.zeros(len(feats), feats[0].shape[0], max(lengths), dtype=embeds.dtype)
        mask = torch.zeros(len(feats), max(lengths), dtype=torch.long)
        for i, f in enumerate(feats):
            batch[i, :, : f.shape[1]] = torch.from_numpy(f)
            mask[i, : f.shape[1]] = 1
        out = self.model.get_audio_features(batch.to(self.device), mask.to(self.device))
        audio = out.last_hidden_state.to(embeds.dtype)
        where = (ids == self.spec.audio_pad_id).unsqueeze(-1).expand_as(embeds)
        if int(where[..., 0].sum()) != audio.shape[0]:
            raise ValueError(
                f"{int(where[..., 0].sum())} audio placeholders but {audio.shape[0]} audio features"
            )
        return embeds.masked_scatter(where, audio)

    def _decode(self, seqs: list[_Seq]) -> list[Any]:
        tokens = torch.tensor([[s.last_token] for s in seqs], device=self.device)  # [B, 1]
        slots = [s.slot for s in seqs]
        starts = [self.cache.lengths[s.slot] for s in seqs]
        h, _ = self.stack.forward(self.embed(tokens), self.cache, slots, starts)
        logits = self.model.lm_head(h[:, -1])  # [B, V]
        self._last_batch = len(seqs)
        return self._emit(seqs, logits)

    def _emit(self, seqs: list[_Seq], logits: torch.Tensor, first_chunk: dict | None = None) -> list[Any]:
        outs: list[Any] = []
        for b, seq in enumerate(seqs):
            rid = seq.request.request_id
            token = seq.sampler.sample(logits[b])
            seq.generated.append(token)
            seq.last_token = token
            outs.append(TokenOutput(rid, (token,)))
            reason = None
            if seq.sampler.is_end(token):
                reason = "stop"
            elif len(seq.generated) >= seq.sampler.params.max_tokens:
                reason = "length"
            if seq.request.want_audio:
                outs.append(self._talker_chunk(seq, token, reason is not None, (first_chunk or {}).get(rid)))
            if reason is not None:
                outs.append(StageFinished(rid, "thinker", reason, len(seq.generated), seq.prompt_len))
                self.running.pop(rid)
                self.cache.release(seq.slot)
        return outs

    def _talker_chunk(self, seq: _Seq, token: int, final: bool, first: ThinkerChunk | None) -> ThinkerChunk:
        # The final token is never fed through the thinker, so the talker never sees it (as in
        # transformers' generate()): the chunk that reports the end carries no token.
        ids: tuple[int, ...] = () if final else (token,)
        embeds = None if final else _np(self.embed(torch.tensor([token], device=self.device)))
        if first is not None:
            return ThinkerChunk(
                first.request_id,
                ids,
                embeds,
                final,
                first.prompt_ids,
                first.prompt_embeds,
                first.prompt_hidden,
                first.request,
            )
        return ThinkerChunk(seq.request.request_id, ids, embeds, final)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def _with_max(s: Any, max_tokens: int) -> Any:
    from dataclasses import replace

    return replace(s, max_tokens=max_tokens, min_tokens=min(s.min_tokens, max_tokens))
