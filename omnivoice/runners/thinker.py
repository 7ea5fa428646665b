"""Thinker runner: prefill new requests, decode the running batch, stream what the talker needs.

As in the talker, a step's inputs are on the device (each slot's last token; sampling state in a
`SlotSampler`), so on a GPU a step is queued before the previous one's tokens are read back
(`overlap`): the host turns step n's tokens into outputs while the GPU computes step n + 1. A request
that samples an end token was then queued for one more step, whose row is dropped. A request held to a
grammar (`Sampling.grammar`, see `constraints.py`) needs its last token on the host before its next
mask: a step with such a request in its batch reads the previous step back before it is queued.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from omnivoice.config import PriorityConfig, ThinkerStage
from omnivoice.messages import (
    AudioStarted,
    EncodeAhead,
    ForgetPrefix,
    NewRequest,
    StageFinished,
    ThinkerChunk,
    TokenOutput,
)
from omnivoice.runners.audio_encoder import AudioEncoder, audio_tower
from omnivoice.runners.constraints import Constraints
from omnivoice.runners.decode_step import DecodeStep
from omnivoice.runners.decoder import DecoderStack
from omnivoice.runners.prefix_cache import PrefixCache, PrefixEntry, position_keys
from omnivoice.runners.priority import Playback, PlaybackPolicy, Priority
from omnivoice.runners.slot_sampling import SlotSampler
from omnivoice.runners.thinker_audio import ThinkerAudio
from omnivoice.runners.thinker_inputs import check_audio, embed_prompt, needed_clips
from omnivoice.runners.transfer import ReadBack, to_device
from omnivoice.runners.vision_encoder import ImageInputs, image_inputs
from omnivoice.types import GenerationRequest, Sampling, StageStats

if TYPE_CHECKING:
    from omnivoice.models.loader import ModelSpec

log = logging.getLogger(__name__)


@dataclass
class _Seq:
    request: GenerationRequest
    slot: int
    max_tokens: int
    prompt_len: int
    # frames: tokens read back (the talker makes at most one frame of each while text streams in)
    playback: Playback
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
class _Pending:
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
class _Step:
    """A queued step, as the host knows it. Its results come back through `ReadBack`: the tokens [n],
    their embeddings for the talker [n, H] (or None), and per row of a prefill the prompt's
    embeddings and hidden states (or None)."""

    seqs: list[_Seq]
    counts: list[int]  # each row's tokens with this step's


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
    ) -> None:
        """`tokenizer`: the served model's (Hugging Face), which grammars are compiled against; without
        one, a request with a grammar is refused."""
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
        self.decode_step = DecodeStep(
            self.stack,
            self.cache,
            cfg.max_batch,
            device,
            cfg.execution == "cuda_graph",
            "thinker",
            keep=(spec.accept_hidden_layer,),
        )
        self.prefix = PrefixCache(cfg.prefix_cache_entries, self._release)
        vocab = thinker.lm_head.out_features
        self.sampler = SlotSampler(self.cache.scratch + 1, vocab, spec.thinker_eos_ids, None, device)
        self.constraints = Constraints(tokenizer, vocab, spec.thinker_eos_ids, device)
        self.tokens = torch.zeros(self.cache.scratch + 1, dtype=torch.long, device=device)  # each slot's last
        # read a step's results back after queuing the next one
        self.overlap = device.type == "cuda" if cfg.overlap is None else cfg.overlap
        self._queued: ReadBack[_Step] = ReadBack()
        self.waiting: deque[GenerationRequest] = deque()
        # the audio encoder: waiting requests' clips and speech sent ahead, a budget of windows per step
        windows, graphs = cfg.audio_windows_per_step, cfg.execution == "cuda_graph"
        encoder = AudioEncoder(audio_tower(thinker), device, windows, graphs)
        self.audio = ThinkerAudio(encoder, windows, conversations=cfg.max_batch + cfg.prefix_cache_entries)
        self._keys: dict[str, list] = {}  # position keys of waiting requests whose audio is planned
        self.running: dict[str, _Seq] = {}
        self._steps = 0
        self._last_batch = 0
        self._prefilled = False  # the last step prefilled prompts (its time is no decode step's)
        self._cached_tokens = 0
        if cfg.execution == "cuda_graph":
            with torch.inference_mode():
                self.decode_step.capture_all(text_model.config.hidden_size, thinker.dtype)
        with torch.inference_mode():
            self.stack.warm_prefill(self.cache, thinker.dtype)
            encoder.capture_all()

    # ---- StageRunner -------------------------------------------------------------------------
    def accept(self, msg: Any) -> list[Any]:
        if isinstance(msg, EncodeAhead):
            self.audio.ahead(msg.cache_key, msg.features)
            return []
        if isinstance(msg, ForgetPrefix):
            self.prefix.drop(msg.cache_key)
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
        self.waiting.append(req)
        return []

    def abort(self, request_id: str) -> None:
        self.waiting = deque(r for r in self.waiting if r.request_id != request_id)
        self.constraints.drop(request_id)
        self.audio.drop(request_id)
        self._keys.pop(request_id, None)
        seq = self.running.pop(request_id, None)
        if seq is not None:
            self._retire(seq)  # a barged-in answer still leaves a reusable prefix

    def _can_admit(self, admitted: int = 0) -> bool:
        room = self.cache.free_slots > 0 or len(self.prefix) > 0
        return bool(self.waiting) and len(self.running) + admitted < self.cfg.max_batch and room

    def has_work(self) -> bool:
        return bool(self._queued) or bool(self._decoding()) or self._can_admit() or self.audio.has_work()

    def urgency(self) -> Priority | None:
        waiting = [_waiting_playback(r) for r in self.waiting] if self._can_admit() else []
        own = self.policy.urgency([*waiting, *(s.playback for s in self._decoding())])
        # speech sent ahead while it is still spoken is the only work left: it may wait for others'
        return Priority.AHEAD if own is None and self.audio.has_work() else own

    def _decoding(self) -> list[_Seq]:
        # a request whose last token is queued ends when that step is read back
        return [s for s in self.running.values() if s.sampled < s.max_tokens]

    def active_ids(self) -> list[str]:
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
        # Admit new requests first (in playback order), prefilled together: their first token is on
        # the time-to-first-audio path. At most max_prefill_tokens prompt tokens per step, and
        # audio_windows_per_step windows of their audio encoded, keep decode steps flowing; a request
        # waits until its audio is encoded.
        if len(self.waiting) > 1:
            self.waiting = deque(self.policy.order(self.waiting, _waiting_playback))
        self.audio.step(self.waiting, self._clips)
        batch: list[_Pending] = []
        budget = self.cfg.max_prefill_tokens
        while self._can_admit(len(batch)) and self._next_fits(budget if batch else None):
            batch.append(self._admit(self.waiting.popleft()))
            budget -= batch[-1].embeds.shape[1]
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
    def _clips(self, req: GenerationRequest) -> list[int]:
        """The audio clips of a waiting request past its conversation's cached prefix (its position
        keys are kept for its admission)."""
        keys, _, reuse = self._match(req, self._keys.get(req.request_id))
        if req.cache_key:
            self._keys[req.request_id] = keys
        return needed_clips(req.prompt, self.spec.audio_pad_id, reuse)

    def _next_fits(self, tokens_left: int | None) -> bool:
        """Whether the head of the queue may join this step's prefill: its audio is encoded, and its
        prompt fits the tokens left (None: the first of the batch, which always fits)."""
        req = self.waiting[0]
        fits = tokens_left is None or len(req.prompt.input_ids) <= tokens_left
        return fits and self.audio.ready(req.request_id)

    def _match(self, req: GenerationRequest, keys: list | None) -> tuple[list, PrefixEntry | None, int]:
        """`req`'s position keys, its conversation's cached prefix and how much of it the prompt reuses
        (at least one position is computed, for the first token's logits)."""
        if not req.cache_key:
            return [], None, 0
        keys = (
            position_keys(req.prompt, self.spec.audio_pad_id, self.spec.image_pad_id)
            if keys is None
            else keys
        )
        entry, reuse = self.prefix.match(req.cache_key, keys)
        return keys, entry, min(reuse, len(req.prompt.input_ids) - 1)

    def _admit(self, req: GenerationRequest) -> _Pending:
        """Take a KV slot for `req` (its conversation's cached one if any) and embed what is new."""
        keys, entry, reuse = self._match(req, self._keys.pop(req.request_id, None))
        if entry is not None and req.cache_key:  # an entry is only found under a key
            slot = self.prefix.take(req.cache_key)  # the conversation's slot: prefill on top of it in place
        else:
            if self.cache.free_slots == 0:
                self.prefix.evict_one()
            slot = self.cache.alloc()
        # the cached part may have shrunk since the audio was planned (its entry evicted): encode the rest
        if self.audio.plan(req, needed_clips(req.prompt, self.spec.audio_pad_id, reuse)):
            self.audio.encode_now(req.request_id)
        audio = self.audio.take(req.request_id)
        embeds = embed_prompt(self.model, self.spec.audio_pad_id, req.prompt, reuse, self.device, audio)
        images, delta = None, 0
        if req.prompt.image_grids:
            if self.spec.image_pad_id is None:
                raise ValueError("the served model takes no images")
            merge = self.model.config.vision_config.spatial_merge_size
            images, delta = image_inputs(self.model, req.prompt, self.spec.image_pad_id, merge, embeds, reuse)
        return _Pending(req, slot, reuse, entry if reuse > 0 else None, keys, embeds, images, delta)

    def _prefill(self, batch: list[_Pending]) -> list[Any]:
        accept = self.spec.accept_hidden_layer
        lengths = [p.embeds.shape[1] for p in batch]
        if len(batch) > 1:
            log.debug("prefilling %d requests together (%d tokens)", len(batch), sum(lengths))
        longest = max(lengths)
        embeds = torch.cat(
            [torch.nn.functional.pad(p.embeds, (0, 0, 0, longest - p.embeds.shape[1])) for p in batch]
        )  # [B, T, H], right-padded
        slot_ids, starts = [p.slot for p in batch], [p.reuse for p in batch]
        for p in batch:
            self.cache.rope_delta[p.slot] = p.rope_delta
        if any(p.images is not None for p in batch):
            rope, deepstack = _image_rows(batch, longest)
            h, kept = self.stack.forward(
                embeds, self.cache, slot_ids, starts, (0, accept), lengths, rope.to(embeds.device), deepstack
            )
        else:
            h, kept = self.stack.prefill(
                embeds, self.cache, slot_ids, starts, keep=(0, accept), lengths=lengths
            )
        outs: list[Any] = []
        seqs: list[_Seq] = []
        prompts: list[tuple[torch.Tensor, torch.Tensor] | None] = []
        rows: list[int] = []
        resets: list[tuple[int, Sampling, tuple[int, ...]]] = []  # (slot, sampling, history) to set
        for b, (p, n_new) in enumerate(zip(batch, lengths, strict=True)):
            seq, prompt = self._start(p, kept[0][b, :n_new], kept[accept][b, :n_new], resets)
            if prompt is None:  # prefill-only: cached, done
                outs.append(StageFinished(p.request.request_id, "thinker", "stop", 0, seq.prompt_len))
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
        self, p: _Pending, embeds: torch.Tensor, hidden: torch.Tensor, resets: list
    ) -> tuple[_Seq, tuple[torch.Tensor, torch.Tensor] | None]:
        """Book a prefilled request: a running sequence, and the prompt's embeddings and accept-layer
        hidden states [n, H] that its first chunk brings the talker (None: prefill-only, done). Its
        sampler slot is added to `resets`, set for the whole batch at once."""
        req, n = p.request, len(p.request.prompt.input_ids)
        if p.entry is not None:
            embeds = torch.cat([p.entry.embeds[: p.reuse], embeds])  # [n, H]
            hidden = torch.cat([p.entry.hidden[: p.reuse], hidden])
        max_new = min(req.thinker.max_tokens, self.cfg.max_seq_len - n)
        params = req.thinker if max_new == req.thinker.max_tokens else _with_max(req.thinker, max_new)
        if params.grammar is not None and params.min_tokens:
            params = replace(params, min_tokens=0)  # a grammar decides where the answer may end
        seq = _Seq(req, p.slot, params.max_tokens, prompt_len=n, playback=Playback(stream=req.want_audio))
        if req.cache_key:
            seq.keys, seq.embeds, seq.hidden = p.keys, [embeds], [hidden]
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
        return seq, (embeds, hidden)

    def _retire(self, seq: _Seq) -> None:
        """Free a finished request's slot, or keep it as its conversation's cached prefix."""
        if seq.request.cache_key and seq.embeds:
            self.prefix.put(seq.request.cache_key, seq.prefix_entry())
        else:
            self._release(seq.slot)

    def _release(self, slot: int) -> None:
        self.cache.release(slot)
        self.sampler.release(slot)

    def _decode(self, seqs: list[_Seq]) -> None:
        """Queue one decode step of the running batch."""
        slots = [s.slot for s in seqs]
        slot_idx = self.decode_step.slot_index(slots)  # padded to a batch bucket on the GPU
        embeds = self.embed(self.tokens[slot_idx][:, None])  # [R, 1, H]: each row's last token
        accept = self.spec.accept_hidden_layer
        h, kept = self.decode_step(embeds, slots, slot_idx)
        for b, s in enumerate(seqs):
            if s.request.cache_key:
                s.embeds.append(embeds[b])
                s.hidden.append(kept[accept][b : b + 1])
        logits = self.model.lm_head(h)  # [B, V]
        self._last_batch = len(seqs)
        self._sample(seqs, logits, slot_idx[: len(seqs)])

    def _sample(
        self,
        seqs: list[_Seq],
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
        self._queued.put(_Step(seqs, [s.sampled for s in seqs]), (tokens, embeds, prompt_rows))

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
                token = tokens[b]
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
                elif q.counts[b] >= seq.max_tokens:
                    reason = "length"
                if seq.request.want_audio and seq.talking:
                    assert embeds is not None
                    # The talker never speaks a function call: its text ends where one opens (in a
                    # request that offers functions; without, the text is all said, as written).
                    seq.talking = token != self.spec.tool_call_id or seq.request.tools is None
                    final = reason is not None or not seq.talking
                    outs.append(self._talker_chunk(seq, token, embeds[b : b + 1], final, prompt_rows[b]))
                if reason is not None:
                    n = len(seq.generated)
                    outs.append(StageFinished(rid, "thinker", reason, n, seq.prompt_len, error))
                    self.running.pop(rid)
                    self.constraints.drop(rid)
                    self._retire(seq)
        return outs

    def _talker_chunk(
        self,
        seq: _Seq,
        token: int,
        embed: np.ndarray,
        final: bool,
        prompt: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> ThinkerChunk:
        # The final token is never fed through the thinker, so the talker never sees it (as in
        # transformers' generate()): the chunk that reports the end carries no token, nor does the one
        # that ends the talker's text at a function call. A request's first chunk also brings its
        # prompt.
        rid = seq.request.request_id
        ids: tuple[int, ...] = () if final else (token,)
        embeds = None if final else embed  # [1, H]
        if prompt is None:
            return ThinkerChunk(rid, ids, embeds, final)
        req = seq.request
        return ThinkerChunk(
            rid, ids, embeds, final, req.prompt.input_ids, prompt[0].numpy(), prompt[1].numpy(), req
        )


def _waiting_playback(req: GenerationRequest) -> Playback:
    """A request waiting for its prefill: FIRST, but a prefill-only one (a session's early start,
    which no one is waiting on yet) is NORMAL."""
    return Playback(started_at=0.0, stream=False) if req.prefill_only else Playback(stream=req.want_audio)


def _image_rows(batch: list[_Pending], t: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A prefill batch's rotary positions [3, B, t] and deepstack inputs (each [B, t, H]): a row
    without images at its cache positions with no deepstack; the padding repeats its row's last."""
    rows, stacks = [], []
    layers = max(len(p.images.deepstack) for p in batch if p.images is not None)
    for p in batch:
        n, hidden = p.embeds.shape[1], p.embeds.shape[2]
        if p.images is None:
            rope = (p.reuse + torch.arange(n)).expand(3, -1)
            deepstack = [p.embeds.new_zeros(n, hidden)] * layers
        else:
            rope, deepstack = p.images.rope.cpu(), p.images.deepstack
        rows.append(torch.cat([rope, rope[:, -1:].expand(3, t - n)], dim=1))
        stacks.append([torch.nn.functional.pad(d, (0, 0, 0, t - n)) for d in deepstack])
    return torch.stack(rows, dim=1), [torch.stack(layer) for layer in zip(*stacks, strict=True)]


def _with_max(s: Any, max_tokens: int) -> Any:
    return replace(s, max_tokens=max_tokens, min_tokens=min(s.min_tokens, max_tokens))
