"""Thinker runner: prefill new requests, decode the running batch, stream what the talker needs.

As in the talker, a step's inputs are on the device (each slot's last token; sampling state in a
`SlotSampler`), so on a GPU a step is queued before the previous one's tokens are read back
(`overlap`): the host turns step n's tokens into outputs while the GPU computes step n + 1. A request
that samples an end token was then queued for one more step, whose row is dropped. A request held to a
grammar (`Sampling.grammar`, see `constraints.py`) needs its last token on the host before its next
mask: a step with such a request in its batch reads the previous step back before it is queued.

Which waiting requests a step prefills, and their inputs, are `thinker_prefill.py`'s; a request's
bookkeeping is `thinker_seq.py`'s; what a token read back becomes is `thinker_outputs.py`'s.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Any

import torch

from omnivoice.config import PriorityConfig, ThinkerStage
from omnivoice.messages import (
    AudioStarted,
    EncodeAhead,
    ForgetPrefix,
    NewRequest,
    StageFinished,
)
from omnivoice.runners.audio_encoder import AudioEncoder, audio_tower
from omnivoice.runners.constraints import Constraints
from omnivoice.runners.decode_step import DecodeStep
from omnivoice.runners.decoder import DecoderStack
from omnivoice.runners.graph_backlog import GraphBacklog
from omnivoice.runners.prefix_cache import PrefixCache
from omnivoice.runners.priority import PlaybackPolicy, Priority
from omnivoice.runners.slot_sampling import SlotSampler
from omnivoice.runners.start_steps import StartSteps
from omnivoice.runners.thinker_audio import ThinkerAudio
from omnivoice.runners.thinker_inputs import check_audio
from omnivoice.runners.thinker_outputs import TokenReader
from omnivoice.runners.thinker_prefill import PrefillAdmission, fitting_groups, forward_prefill
from omnivoice.runners.thinker_seq import Pending, QueuedStep, ThinkerSeq, start_seq, waiting_playback
from omnivoice.runners.transfer import ReadBack, to_device
from omnivoice.types import GenerationRequest, Sampling, StageStats

if TYPE_CHECKING:
    from omnivoice.models.loader import ModelSpec

log = logging.getLogger(__name__)


class ThinkerRunner:
    name = "thinker"

    def __init__(
        self,
        thinker: Any,
        spec: ModelSpec,
        cfg: ThinkerStage,
        device: torch.device,
        tokenizer: Any | None = None,
        priority: PriorityConfig | None = None,
        start: StartSteps | None = None,
    ) -> None:
        """`tokenizer`: the served model's (Hugging Face), which grammars are compiled against; without
        one, a request with a grammar is refused. `start`: where the steps of the build are timed."""
        self.model = thinker
        self.spec = spec
        self.cfg = cfg
        self.device = device
        self.policy = PlaybackPolicy(priority or PriorityConfig(), 1.0 / spec.frame_rate)
        # transformers 5.2x wraps the text model as `model.language_model`; 5.17 (the GPU image's) does not
        text_model = getattr(thinker.model, "language_model", thinker.model)
        self.stack = DecoderStack(text_model, multimodal_rope=True)
        if device.type == "cuda":
            self.stack.fuse(compile=cfg.compile, prefill=cfg.fused_prefill)
        self.embed = thinker.get_input_embeddings()
        # one slot per running request, plus one per cached conversation prefix
        slots = cfg.max_batch + cfg.prefix_cache_entries
        self.cache = self.stack.make_cache(slots, cfg.max_seq_len, thinker.dtype, device)
        graphs, keep = cfg.execution == "cuda_graph", (spec.accept_hidden_layer,)
        self.decode_step = DecodeStep(
            self.stack, self.cache, cfg.max_batch, device, graphs, "thinker", keep=keep
        )
        self.prefix = PrefixCache(cfg.prefix_cache_entries, self._release)
        vocab = thinker.lm_head.out_features
        self.sampler = SlotSampler(self.cache.scratch + 1, vocab, spec.thinker_eos_ids, None, device)
        self.constraints = Constraints(tokenizer, vocab, spec.thinker_eos_ids, device)
        self.tokens = torch.zeros(self.cache.scratch + 1, dtype=torch.long, device=device)  # each slot's last
        # read a step's results back after queuing the next one
        self.overlap = device.type == "cuda" if cfg.overlap is None else cfg.overlap
        self._queued: ReadBack[QueuedStep] = ReadBack()
        # the audio encoder: waiting requests' clips and speech sent ahead, a budget of windows per step
        windows = cfg.audio_windows_per_step
        encoder = AudioEncoder(audio_tower(thinker), device, windows, graphs)
        self.audio = ThinkerAudio(encoder, windows, conversations=cfg.max_batch + cfg.prefix_cache_entries)
        self.admission = PrefillAdmission(thinker, spec, cfg, device, self.cache, self.prefix, self.audio)
        self.reader = TokenReader(self.sampler, self.constraints, self.policy, spec.tool_call_id)
        self.running: dict[str, ThinkerSeq] = {}
        # this step's prefill batch until each of its forwards is done (None: still being admitted): a
        # step failing in its prefill fails these, not the running rows its decode had not reached
        self._prefill_batch: dict[str, Pending | None] = {}
        self._steps = 0
        self._last_batch = 0
        self._prefilled = False  # the last step prefilled prompts (its time is no decode step's)
        self._cached_tokens = 0
        self._prefilled_tokens = 0  # prompt positions computed (those past a cached prefix)
        self.graph_backlog = GraphBacklog(self.name)  # graphs of wide batches captured once serving
        steps = start or StartSteps(self.name)
        if graphs:
            with steps.step("decode graphs"), torch.inference_mode():
                self.decode_step.capture_all(
                    text_model.config.hidden_size, thinker.dtype, cfg.graphs_at_start, self.graph_backlog
                )
        if self.stack.compiles_prefill:
            with steps.step("prefill compile"), torch.inference_mode():
                self.stack.warm_prefill(self.cache, thinker.dtype)
        with steps.step("audio encoder"), torch.inference_mode():
            encoder.capture_all()

    @property
    def waiting(self) -> deque[GenerationRequest]:
        """The requests waiting for their prefill, in the order they are admitted."""
        return self.admission.waiting

    # ---- StageRunner -------------------------------------------------------------------------
    def accept(self, msg: Any) -> list[Any]:
        if isinstance(msg, EncodeAhead):
            self.audio.ahead(msg.cache_key, msg.features)
            return []
        if isinstance(msg, ForgetPrefix):
            self.prefix.forget(msg.cache_key)
            self.audio.forget(msg.cache_key)
            return []
        if isinstance(msg, AudioStarted):
            if (seq := self.running.get(msg.request_id)) is not None:
                seq.playback.start(self.policy.clock())
            return []
        if not isinstance(msg, NewRequest):
            raise TypeError(f"thinker cannot take {type(msg).__name__}")
        req = msg.request
        n = len(req.prompt.input_ids)
        if n == 0 or n >= self.cfg.max_seq_len:
            raise ValueError(f"prompt of {n} tokens does not fit the context of {self.cfg.max_seq_len}")
        check_audio(req.prompt, self.spec.audio_pad_id, self.audio.encoder.n_mels, self.audio.encoder.tokens)
        if req.thinker.grammar is not None and not req.prefill_only:
            self.constraints.add(req.request_id, req.thinker.grammar)  # compiled here, off the step
        self.admission.waiting.append(req)
        return []

    def abort(self, request_id: str) -> None:
        self.admission.drop(request_id)
        self.constraints.drop(request_id)
        self.audio.drop(request_id)
        in_prefill = request_id in self._prefill_batch
        pending = self._prefill_batch.pop(request_id, None)
        seq = self.running.pop(request_id, None)
        if seq is not None and not in_prefill:
            # a barged-in answer, or a speculative one the caller spoke past, still leaves a reusable
            # prefix, and its caller is speaking: the turn that takes it back comes soon
            self._retire(seq, answered=False)
        elif seq is not None:  # its prefill failed: its slot holds nothing to keep
            self._release(seq.slot)
        elif pending is not None:
            self._release(pending.slot)

    def has_work(self) -> bool:
        return bool(self._queued) or bool(self._decoding()) or self._can_admit() or self.audio.has_work()

    def urgency(self) -> Priority | None:
        waiting = [waiting_playback(r) for r in self.waiting] if self._can_admit() else []
        own = self.policy.urgency([*waiting, *(s.playback for s in self._decoding())])
        # speech sent ahead while it is still spoken is the only work left: it may wait for others'
        return Priority.AHEAD if own is None and self.audio.has_work() else own

    def _can_admit(self) -> bool:
        return self.admission.can_admit(len(self.running))

    def _decoding(self) -> list[ThinkerSeq]:
        # a request whose last token is queued ends when that step is read back
        return [s for s in self.running.values() if s.sampled < s.max_tokens]

    def active_ids(self) -> list[str]:
        if self._prefill_batch:  # it failed admitting or prefilling these, before the running rows'
            return list(self._prefill_batch)  # decode and after the waiting requests' audio was encoded
        # with the waiting requests whose audio a step encodes: a step that fails fails them too
        return [*self.running, *self.audio.planned_ids()]

    def stats(self) -> StageStats:
        return StageStats(
            self.name,
            len(self.waiting),
            len(self.running),
            self._last_batch,
            self._steps,
            last_step_prefilled=self._prefilled,
            cached_tokens=self._cached_tokens,
            prefilled_tokens=self._prefilled_tokens,
            prefixes=len(self.prefix),
            kv_slots_used=len(self.cache.lengths) - self.cache.free_slots,
            audio_windows=self.audio.encoder.windows_encoded,
            audio_windows_ahead=self.audio.ahead_used,
        )

    @torch.inference_mode()
    def step(self, defer_ahead: bool = False) -> list[Any]:
        """One step: prefill what is admitted, decode the running batch (without its AHEAD requests
        when `defer_ahead`), read back what is due."""
        outs: list[Any] = []
        decoding = self.policy.select(self._decoding(), lambda s: s.playback, defer_ahead)
        if self._queued and self.constraints.any(s.request.request_id for s in decoding):
            outs += self._read_back(0)  # a constrained row's mask needs its last token: sync
            decoding = self.policy.select(self._decoding(), lambda s: s.playback, defer_ahead)
        queued = len(self._queued)
        self._last_batch = 0  # the decode batch of this step (none: a step of prefills or read-backs)
        self._prefilled = False
        # new requests first, prefilled together: their first token is on the time-to-first-audio path
        self._prefill_batch = {}
        batch = self.admission.admit(self.policy, len(self.running), self._prefill_batch)
        if batch:
            self._prefilled = True
            outs += self._prefill(batch)
        if decoding:
            self._decode(decoding)
        self._steps += 1
        # with overlap, what was queued just now is read back on the next call, while the GPU runs it
        keep = len(self._queued) - queued if self.overlap else 0
        return outs + self._read_back(keep)

    # ---- internals ---------------------------------------------------------------------------
    def _prefill(self, batch: list[Pending]) -> list[Any]:
        """Prefill the admitted batch, in as few forwards as fit the KV slots, book each request and
        queue its first token."""
        groups = fitting_groups(batch, self.cfg.max_seq_len)
        if len(groups) > 1:
            log.debug("prefill of %d requests in %d forwards (the KV slot length)", len(batch), len(groups))
        outs: list[Any] = []
        for group in groups:
            outs += self._prefill_group(group)
            for p in group:  # done: a later failure of this step is not theirs
                del self._prefill_batch[p.request.request_id]
        return outs

    def _prefill_group(self, batch: list[Pending]) -> list[Any]:
        """Prefill requests together in one forward, book each and queue its first token."""
        accept = self.spec.accept_hidden_layer
        h, kept, lengths = forward_prefill(self.stack, self.cache, batch, accept)
        self._prefilled_tokens += sum(lengths)
        outs: list[Any] = []
        seqs: list[ThinkerSeq] = []
        prompts: list[tuple[torch.Tensor, torch.Tensor] | None] = []
        rows: list[int] = []
        resets: list[tuple[int, Sampling, tuple[int, ...]]] = []  # (slot, sampling, history) to set
        for b, (p, n_new) in enumerate(zip(batch, lengths, strict=True)):
            seq, prompt = self._start(p, kept[0][b, :n_new], kept[accept][b, :n_new], resets)
            if prompt is None:  # prefill-only: cached, done
                rid = p.request.request_id
                outs.append(
                    StageFinished(rid, "thinker", "stop", 0, seq.prompt_len, cached_tokens=seq.cached)
                )
                continue
            seqs.append(seq)
            prompts.append(prompt)
            rows.append(b)
        if resets:
            slots, params, histories = zip(*resets, strict=True)
            self.sampler.reset(slots, params, histories)
        if seqs:
            index = to_device(rows, h.device)
            ends = to_device([lengths[b] - 1 for b in rows], h.device)
            logits = self.model.lm_head(h[index, ends])  # [B', V]
            self._sample(seqs, logits, to_device([s.slot for s in seqs], self.device), prompts)
        return outs

    def _start(
        self, p: Pending, embeds: torch.Tensor, hidden: torch.Tensor, resets: list
    ) -> tuple[ThinkerSeq, tuple[torch.Tensor, torch.Tensor] | None]:
        """Book a prefilled request: a running sequence, and the prompt's embeddings and accept-layer
        hidden states [n, H] that its first chunk brings the talker (None: prefill-only, done). Its
        sampler slot is added to `resets`, set for the whole batch at once."""
        seq, params, prompt = start_seq(p, embeds, hidden, self.cfg.max_seq_len)
        req, n = p.request, seq.prompt_len
        self._cached_tokens += p.reuse
        if p.reuse:
            log.debug(
                "request %s: %d of %d prompt positions from the prefix cache", req.request_id, p.reuse, n
            )
        if req.prefill_only:
            self._retire(seq)
            return seq, None
        self.running[req.request_id] = seq
        resets.append((p.slot, params, req.prompt.input_ids))
        return seq, prompt

    def _retire(self, seq: ThinkerSeq, answered: bool = True) -> None:
        """Free a finished request's slot, or keep it as its conversation's cached prefix: a stored
        answer (`answered`, its playback still ahead), or a turn its caller is still speaking."""
        if seq.request.cache_key and seq.embeds:
            answered = answered and not seq.request.prefill_only
            self.prefix.put(seq.request.cache_key, seq.prefix_entry(), answered=answered)
        else:
            self._release(seq.slot)

    def _release(self, slot: int) -> None:
        self.cache.release(slot)
        self.sampler.release(slot)

    def _decode(self, seqs: list[ThinkerSeq]) -> None:
        """Queue one decode step of the running batch."""
        slots = [s.slot for s in seqs]
        slot_idx = self.decode_step.slot_index(slots)  # padded to a batch bucket on the GPU
        embeds = self.embed(self.tokens[slot_idx][:, None])  # [R, 1, H]: each row's last token
        accept = self.spec.accept_hidden_layer
        h, kept = self.decode_step(embeds, slots, slot_idx)
        keyed = [b for b, s in enumerate(seqs) if s.request.cache_key]
        if keyed:
            # each row's [1, H] views from one unbind apiece, not two Python indexings per request
            embed_rows, hidden_rows = embeds.unbind(0), kept[accept][:, None].unbind(0)
            for b in keyed:
                seqs[b].embeds.append(embed_rows[b])
                seqs[b].hidden.append(hidden_rows[b])
        logits = self.model.lm_head(h)  # [B, V]
        self._last_batch = len(seqs)
        self._sample(seqs, logits, slot_idx[: len(seqs)])

    def _sample(
        self,
        seqs: list[ThinkerSeq],
        logits: torch.Tensor,
        slot_idx: torch.Tensor,
        prompts: list[tuple[torch.Tensor, torch.Tensor] | None] | None = None,
    ) -> None:
        """Sample each row's next token on the device (slot_idx: the rows' slots there) and queue the
        step's results for the host."""
        slots = [s.slot for s in seqs]
        if self.constraints.matchers:  # else nothing to mask: no cost to unconstrained batches
            self.constraints.mask(logits, [s.request.request_id for s in seqs])
        draw = any(slot in self.sampler.generators for slot in slots)  # else all greedy: no sort
        tokens = self.sampler.sample(logits, slot_idx, self.sampler.draws(slots, len(slots)), draw=draw)
        self.tokens[slot_idx] = tokens
        # the talker's inputs: embeddings of the new tokens, brought over with the tokens in one go
        embeds = self.embed(tokens) if any(s.request.want_audio for s in seqs) else None
        for s in seqs:
            s.sampled += 1
        prompt_rows = prompts or [None] * len(seqs)
        self._queued.put(QueuedStep(seqs, [s.sampled for s in seqs]), (tokens, embeds, prompt_rows))

    def _read_back(self, keep: int) -> list[Any]:
        """Turn every queued step but the last `keep` into outputs, and end the requests it ends."""
        outs: list[Any] = []
        for q, (host_tokens, host_embeds, prompt_rows) in self._queued.take(keep):
            tokens = host_tokens.tolist()
            embeds = None if host_embeds is None else host_embeds.numpy()
            for b, seq in enumerate(q.seqs):
                rid = seq.request.request_id
                if self.running.get(rid) is not seq:
                    continue  # ended (its end token was in an earlier step) or aborted since
                embed = None if embeds is None else embeds[b : b + 1]  # [1, H]
                if self.reader.read(seq, tokens[b], q.counts[b], embed, prompt_rows[b], outs):
                    self.running.pop(rid)
                    self.constraints.drop(rid)
                    self._retire(seq)
        return outs
