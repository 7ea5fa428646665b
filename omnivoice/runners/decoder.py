"""Forward of a transformers decoder stack (Qwen3 / Qwen3-MoE layers) over our slot KV cache.

The layers' own modules (norms, projections, MoE blocks, rotary embedding) are reused as they are,
so the weights and the math are transformers'; only the attention's cache and masking are ours, so
requests of different lengths decode together in one batch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, cast

import torch
from torch import nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import apply_rotary_pos_emb

from omnivoice.runners.fused_layers import CompiledFn, LayerWeights, decode_layer, layer_weights
from omnivoice.runners.graphs import bucket, kv_buckets
from omnivoice.runners.kv_cache import SlotKVCache, write_read
from omnivoice.runners.transfer import to_device

log = logging.getLogger(__name__)


class DecoderStack:
    """`model` is a transformers text model with `.layers`, `.norm` and `.rotary_emb`."""

    def __init__(self, model: nn.Module, multimodal_rope: bool) -> None:
        # the layers are duck-typed transformers decoder layers (their submodules differ by model)
        self.layers: list[Any] = list(cast(nn.ModuleList, model.layers))
        self.norm = cast(nn.Module, model.norm)
        self.rotary = cast(nn.Module, model.rotary_emb)
        self.multimodal_rope = multimodal_rope
        attn = self.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.kv_heads = attn.k_proj.out_features // attn.head_dim
        # GPU decode: fewer, larger kernels (see `fuse`); empty on the CPU, where the layers' own
        # modules run, so the CPU path stays exactly transformers' math
        self._qkv: list[torch.Tensor] = []
        self._qkv_split: tuple[int, int, int] = (0, 0, 0)
        self._gate_up: list[torch.Tensor | None] = []
        self._fused: list[LayerWeights | None] = []  # per layer: its tensors for `fused_layers`
        self._layer: Callable[..., torch.Tensor] = decode_layer  # or its CompiledFn
        self._fused_prefill = False  # prompts through the fused layers too (`prefill`)

    def fuse(self, compile: bool = False, prefill: bool = False) -> None:
        """Fuse for GPU decode: q/k/v in one GEMM, a dense MLP's gate/up in one GEMM, and each layer
        as `fused_layers.decode_layer` (torch.compile'd with `compile`: a handful of kernels around
        the GEMMs). A decode step is a few hundred kernels per layer stack, each costing
        microseconds even inside a CUDA graph, so fewer kernels is directly a faster step. The separate
        projections become views into the fused weights: no memory is duplicated. `prefill`: prompts
        through these layers too (see `prefill`)."""
        for layer in self.layers:
            attn = layer.self_attn
            projs = (attn.q_proj, attn.k_proj, attn.v_proj)
            if any(p.bias is not None for p in projs):
                self._qkv = []
                break
            self._qkv.append(_concat_weights(projs))
            self._qkv_split = tuple(p.out_features for p in projs)  # type: ignore[assignment]
            mlp = layer.mlp
            dense = all(hasattr(mlp, a) for a in ("gate_proj", "up_proj", "down_proj"))
            dense = dense and mlp.gate_proj.bias is None and mlp.up_proj.bias is None
            self._gate_up.append(_concat_weights((mlp.gate_proj, mlp.up_proj)) if dense else None)
        if self._qkv:
            weights = zip(self.layers, self._qkv, self._gate_up, strict=True)
            self._fused = [layer_weights(layer, qkv, gate_up) for layer, qkv, gate_up in weights]
            if compile and any(w is not None for w in self._fused):
                self._layer = CompiledFn(decode_layer, "decode layers")
        self._fused_prefill = prefill and bool(self._qkv)

    def make_cache(
        self, num_slots: int, max_len: int, dtype: torch.dtype, device: torch.device
    ) -> SlotKVCache:
        return SlotKVCache(len(self.layers), num_slots, self.kv_heads, max_len, self.head_dim, dtype, device)

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # positions [B, T]; text and audio positions are 1-D, so all three mrope axes are equal
        pos = positions.unsqueeze(0).expand(3, -1, -1) if self.multimodal_rope else positions
        return self.rotary(x, pos)

    def forward(
        self,
        h: torch.Tensor,
        cache: SlotKVCache,
        slots: list[int],
        starts: list[int],
        keep: Iterable[int] = (),
        lengths: list[int] | None = None,
        rope: torch.Tensor | None = None,
        deepstack: list[torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """h: [B, T, H] inputs at positions starts[b]..starts[b]+T of each row's slot.

        `lengths[b]` <= T is how many of row b's inputs are real (a batch of prompts padded on the
        right); the padding's outputs are garbage and its cache entries are never attended to.
        `rope` [3, B, T]: the inputs' rotary positions when they are not their cache positions (a
        prompt with images); `deepstack[i]` [B, T, H] is added to layer i's output (the vision
        tower's features of its layers on image placeholders, zero elsewhere).
        Returns the final-normed hidden [B, T, H] and the hidden states named in `keep`
        (0 = inputs, k = output of layer k, transformers' `hidden_states[k]`). Advances the slots.
        """
        b, t, _ = h.shape
        device = h.device
        start_idx = to_device(starts, device)  # [B]; made once per forward, copied without a sync
        slot_idx = to_device(slots, device)
        start_t = start_idx.unsqueeze(1)  # [B, 1]
        positions = start_t + torch.arange(t, device=device).unsqueeze(0)  # [B, T]
        cos, sin = self.rotary(h, rope) if rope is not None else self._rope(h, positions)
        length = max(starts) + t
        lengths = lengths or [t] * b
        mask = None
        if b > 1 or (starts[0] > 0 and t > 1):
            keys = torch.arange(length, device=device).view(1, 1, 1, length)
            mask = keys <= positions.view(b, 1, t, 1)  # [B, 1, T, K]
            if min(lengths) < t:
                ends = to_device([s + n for s, n in zip(starts, lengths, strict=True)], device)
                mask = mask & (keys < ends.view(b, 1, 1, 1))
        kept: dict[int, torch.Tensor] = {}
        keep = set(keep)
        if 0 in keep:
            kept[0] = h
        for i, layer in enumerate(self.layers):
            residual = h
            x = layer.input_layernorm(h)
            h = residual + self._attention(
                layer.self_attn, i, x, cos, sin, cache, slots, starts, length, mask, (slot_idx, start_idx)
            )
            h = h + layer.mlp(layer.post_attention_layernorm(h))
            if i + 1 in keep:  # as transformers records a layer's output: before the deepstack
                kept[i + 1] = h
            if deepstack is not None and i < len(deepstack):
                h = h + deepstack[i]
        for slot, start, n in zip(slots, starts, lengths, strict=True):
            cache.lengths[slot] = start + n
        return self.norm(h), kept

    def prefill(
        self,
        h: torch.Tensor,
        cache: SlotKVCache,
        slots: list[int],
        starts: list[int],
        keep: Iterable[int] = (),
        lengths: list[int] | None = None,
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """`forward` of prompts; with `fuse(prefill=True)` through the fused, compiled layers of a
        decode step (`forward_indexed`): a prompt's forward through transformers' modules is bound by
        launching their kernels, and the compiled layers launch far fewer. A row's right padding writes
        keys and values past its prompt, where nothing attends before its decode steps overwrite them.
        Advances the slots."""
        b, t, _ = h.shape
        end = max(starts) + t
        if not self._fused_prefill or end > cache.max_len:
            return self.forward(h, cache, slots, starts, keep, lengths)
        rows_slots, rows_starts = slots, starts
        if b == 1:
            # a padding row in the scratch slot: torch.compile specialises one-row batches, so without
            # it every kind of prompt batch would be compiled twice (a compile takes seconds at start)
            h = torch.cat([h, h.new_zeros(h.shape)])
            rows_slots, rows_starts = [*slots, cache.scratch], [*starts, 0]
        device = h.device
        slot_idx = to_device(rows_slots, device)
        start_idx = to_device(rows_starts, device)
        kv_len = bucket(end, kv_buckets(cache.max_len))  # few compiled shapes
        out, kept = self.forward_indexed(h, cache, slot_idx, start_idx, kv_len, keep)
        if b == 1:
            out, kept = out[:1], {k: v[:1] for k, v in kept.items()}
        for slot, start, n in zip(slots, starts, lengths or [t] * b, strict=True):
            cache.lengths[slot] = start + n
        return out, kept

    @property
    def compiles_prefill(self) -> bool:
        """Whether prompts run through compiled layers (`warm_prefill` has something to compile)."""
        return self._fused_prefill and isinstance(self._layer, CompiledFn)

    def warm_prefill(self, cache: SlotKVCache, dtype: torch.dtype) -> None:
        """Compile the fused layers at prompt shapes before serving, or the first requests would wait
        for it (a compile takes seconds, and a burst whose shape is first met while serving stalls
        every request in it). One kind of prompt batch is compiled: every prompt's MoE groups its
        pairs by a sort (`fused_layers.moe`), and a one-row batch is run as two rows (see `prefill`).
        Borrows free slots and gives them back."""
        if not self.compiles_prefill:
            return
        began = time.perf_counter()
        hidden = self.layers[0].input_layernorm.weight.shape[0]
        device = cache.k.device
        rows, t = 2, 16
        if t <= cache.max_len and rows <= cache.free_slots:  # else a batch no request can bring
            slots = [cache.alloc() for _ in range(rows)]
            try:
                inputs = torch.zeros(rows, t, hidden, dtype=dtype, device=device)
                self.prefill(inputs, cache, slots, [0] * rows)
            finally:
                for slot in slots:
                    cache.release(slot)
        log.info("prefill layers compiled in %.1f s", time.perf_counter() - began)

    def forward_indexed(
        self,
        h: torch.Tensor,
        cache: SlotKVCache,
        slot_idx: torch.Tensor,
        start_idx: torch.Tensor,
        kv_len: int,
        keep: Iterable[int] = (),
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """h: [B, T, H] at positions start_idx[b]..+T of slot slot_idx[b]; every row's T inputs are real.

        Only device tensors and fixed shapes: no host sync, no Python per row, so a CUDA graph can
        capture it. Attention reads the first `kv_len` cache positions (a bucket >= every row's end,
        masked per row) instead of the exact longest length, so the shapes repeat from step to step.
        Does not advance `cache.lengths` (the caller knows the rows' lengths).
        """
        b, t, _ = h.shape
        device = h.device
        positions = start_idx.unsqueeze(1) + torch.arange(t, device=device).unsqueeze(0)  # [B, T]
        # rotary positions: shifted per slot past a prompt's images (a device gather: graph-safe)
        cos, sin = self._rope(h, positions + cache.rope_delta[slot_idx].unsqueeze(1))
        keys = torch.arange(kv_len, device=device).view(1, 1, 1, kv_len)
        mask = keys <= positions.view(b, 1, t, 1)  # [B, 1, T, K]
        kept: dict[int, torch.Tensor] = {}
        keep = set(keep)
        if 0 in keep:
            kept[0] = h
        for i, layer in enumerate(self.layers):
            fused = self._fused[i] if self._fused else None
            if fused is not None:
                h = self._fused_layer(i, fused, h, cos, sin, cache, slot_idx, positions, kv_len, mask)
                if i + 1 in keep:
                    kept[i + 1] = h
                continue
            attn = layer.self_attn
            x = self._norm(layer.input_layernorm, h)
            shape = (b, t, -1, self.head_dim)
            if self._qkv:
                q, k, v = torch.nn.functional.linear(x, self._qkv[i]).split(self._qkv_split, dim=-1)
            else:
                q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
            q = self._norm(attn.q_norm, q.view(shape)).transpose(1, 2)  # [B, Hq, T, D]
            k = self._norm(attn.k_norm, k.view(shape)).transpose(1, 2)  # [B, Hkv, T, D]
            v = v.reshape(shape).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            keys_, values = write_read(cache.k[i], cache.v[i], slot_idx, positions, k, v, kv_len)
            out, _ = sdpa_attention_forward(attn, q, keys_, values, mask, dropout=0.0, scaling=attn.scaling)
            h = h + attn.o_proj(out.reshape(b, t, -1))
            h = h + self._mlp(i, layer.mlp, self._norm(layer.post_attention_layernorm, h))
            if i + 1 in keep:
                kept[i + 1] = h
        return self._norm(self.norm, h), kept

    def _fused_layer(self, i, w, h, cos, sin, cache, slot_idx, positions, kv_len, mask) -> torch.Tensor:
        return self._layer(h, w, cos, sin, cache.k[i], cache.v[i], slot_idx, positions, mask, kv_len)

    def _norm(self, norm: Any, x: torch.Tensor) -> torch.Tensor:
        """`norm` is a transformers RMSNorm (`weight`, `variance_epsilon`)."""
        if not self._qkv:
            return norm(x)
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)

    def _mlp(self, i: int, mlp: Any, x: torch.Tensor) -> torch.Tensor:
        """`mlp` is a transformers MLP block; a dense one has `down_proj` and `act_fn`."""
        fused = self._gate_up[i] if self._gate_up else None
        if fused is None:
            return mlp(x)
        gate, up = torch.nn.functional.linear(x, fused).chunk(2, dim=-1)
        return mlp.down_proj(mlp.act_fn(gate) * up)

    def _attention(
        self, attn, layer_idx, x, cos, sin, cache, slots, starts, length, mask, index
    ) -> torch.Tensor:
        shape = (*x.shape[:-1], -1, self.head_dim)
        q = attn.q_norm(attn.q_proj(x).view(shape)).transpose(1, 2)  # [B, Hq, T, D]
        k = attn.k_norm(attn.k_proj(x).view(shape)).transpose(1, 2)  # [B, Hkv, T, D]
        v = attn.v_proj(x).view(shape).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        cache.write(layer_idx, slots, starts, k, v, index)
        keys, values = cache.read(layer_idx, slots, length, index[0])
        out, _ = sdpa_attention_forward(attn, q, keys, values, mask, dropout=0.0, scaling=attn.scaling)
        return attn.o_proj(out.reshape(*x.shape[:-1], -1).contiguous())


def _concat_weights(linears: tuple[nn.Linear, ...]) -> torch.Tensor:
    """One [sum(out), in] weight for `linears`, which then hold views into it."""
    fused = torch.cat([lin.weight.detach() for lin in linears])
    offset = 0
    for lin in linears:
        n = lin.out_features
        lin.weight = nn.Parameter(fused[offset : offset + n], requires_grad=False)
        offset += n
    return fused
