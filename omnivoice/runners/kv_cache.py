"""A static KV cache with one slot per running request (gpt-fast style, no paging)."""

from __future__ import annotations

import torch


class SlotKVCache:
    """k/v: [layers, slots + 1, kv_heads, max_len, head_dim]. A request owns one slot while it runs.

    The extra last slot (`scratch`) is never handed out: the padding rows of a fixed-size batch write
    their keys and values there.
    """

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        # one position more than a sequence may use: a read of the first kv_len <= max_len positions
        # is then never the whole buffer, so compiled steps need no second version for that case
        shape = (num_layers, num_slots + 1, kv_heads, max_len + 1, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        # per slot: its rotary position minus its cache position for what follows the prompt (an
        # image's placeholders take fewer rotary positions than cache positions); 0 without images
        self.rope_delta = torch.zeros(num_slots + 1, dtype=torch.long, device=device)
        self.lengths = [0] * num_slots
        self.scratch = num_slots
        self._free = list(range(num_slots - 1, -1, -1))

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def alloc(self) -> int:
        if not self._free:
            raise RuntimeError("no free KV cache slot")
        slot = self._free.pop()
        self.lengths[slot] = 0
        return slot

    def release(self, slot: int) -> None:
        self.lengths[slot] = 0
        self._free.append(slot)

    def write(
        self,
        layer: int,
        slots: list[int],
        starts: list[int],
        k: torch.Tensor,
        v: torch.Tensor,
        index: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        """k, v: [B, kv_heads, T, head_dim] for rows at positions starts[b] .. starts[b] + T.

        `index` (slots, starts as device tensors) lets a one-token step of several rows write with one
        indexed copy per tensor instead of one copy per row.
        """
        t = k.shape[2]
        if max(starts) + t > self.max_len:
            raise RuntimeError(f"sequence exceeds the KV cache length {self.max_len}")
        if t == 1 and len(slots) > 1 and index is not None:
            slot_idx, start_idx = index
            self.k[layer][slot_idx, :, start_idx] = k[:, :, 0]  # [B, kv_heads, head_dim]
            self.v[layer][slot_idx, :, start_idx] = v[:, :, 0]
            return
        for b, (slot, start) in enumerate(zip(slots, starts, strict=True)):
            self.k[layer, slot, :, start : start + t] = k[b]
            self.v[layer, slot, :, start : start + t] = v[b]

    def read(
        self, layer: int, slots: list[int], length: int, slot_idx: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of `slots` up to `length`: [B, kv_heads, length, head_dim].

        `slot_idx` is `slots` as a device tensor, made once per forward rather than once per layer.
        """
        if len(slots) == 1:
            s = slots[0]
            return self.k[layer, s : s + 1, :, :length], self.v[layer, s : s + 1, :, :length]
        idx = torch.tensor(slots, device=self.k.device) if slot_idx is None else slot_idx
        return self.k[layer, idx, :, :length], self.v[layer, idx, :, :length]


def write_read(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_idx: torch.Tensor,
    positions: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_len: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Write k, v [B, kv_heads, T, D] of rows slot_idx [B] at positions [B, T] into one layer's
    k_cache/v_cache [slots, kv_heads, max_len, D] (a SlotKVCache's `k[layer]`, `v[layer]`); read back
    the first `kv_len` positions of those slots [B, kv_heads, kv_len, D]. Device indices only
    (graph-safe); traced by torch.compile inside a fused decode layer too, where the writes fuse with
    the rope that makes k."""
    rows = slot_idx.unsqueeze(1)  # [B, 1] broadcast against positions [B, T]
    k_cache[rows, :, positions] = k.transpose(1, 2)  # target [B, T, kv_heads, D]
    v_cache[rows, :, positions] = v.transpose(1, 2)
    return k_cache[slot_idx, :, :kv_len], v_cache[slot_idx, :, :kv_len]
