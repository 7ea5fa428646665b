"""The thinker's audio encoder over the clips of many requests in one padded forward.

Qwen3-Omni's audio tower (transformers' `Qwen3OmniMoeAudioEncoder`) reads a clip's log-mel frames in
chunks of `2 * n_window` frames, each through three stride-2 convolutions on its own (a full chunk
gives `chunk_tokens` tokens, positions 0.. within the chunk), and its transformer layers attend only
within windows of `n_window_infer` frames (`window_chunks` chunks). So windows are independent: a clip
is cut into windows, the windows of every clip in a call are stacked into one batch
`[W, n_mels, K * chunk]`, and each window attends over its own tokens (a key mask hides the
padding). A clip's output is its windows' outputs in order, which is transformers'
`get_audio_features` of the clip alone, whatever else shares the call; and a clip's windows may be
encoded in different calls (while it is still being spoken: see `thinker_audio`).

One detail keeps this exact: transformers pads a clip's last chunk with zeros to a full chunk only when
the clip has a full chunk; a clip shorter than one chunk is convolved unpadded, so each convolution
sees zeros past its end. Such a clip's window (`alone`) zeroes the convolution outputs past the valid
length, which is what the unpadded convolutions read there.

Calls are padded to buckets (windows to a power of two, chunks per window to the longest window's) so
shapes repeat; on a GPU with `graphs`, each bucket is captured once as a CUDA graph and replayed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from omnivoice.runners.gpu_memory import GIB, free_bytes
from omnivoice.runners.graphs import StepGraphs, bucket

log = logging.getLogger(__name__)

# The encoder's graphs are captured while the other stages may still be loading beside it on the same
# GPU: they stop short of its last 2 GiB, which a talker's warm-up needed on an 80 GB card
GRAPHS_LEAVE_BYTES = 2 << 30


def conv_tokens(frames: int) -> int:
    """Tokens the three stride-2 convolutions make of `frames` frames (one chunk at most)."""
    for _ in range(3):
        frames = (frames - 1) // 2 + 1 if frames > 0 else 0
    return frames


def audio_tower(thinker: Any) -> Any:
    """The thinker's audio encoder module (transformers 5.2x nests it under `thinker.model`)."""
    tower = getattr(thinker, "audio_tower", None)
    return tower if tower is not None else thinker.model.audio_tower


def window_buckets(max_windows: int) -> tuple[int, ...]:
    """Windows a call is padded to: powers of two below `max_windows`, then `max_windows`."""
    sizes, n = {max_windows}, 1
    while n < max_windows:
        sizes.add(n)
        n *= 2
    return tuple(sorted(sizes))


@dataclass(frozen=True)
class Window:
    """Up to one attention window of a clip's log-mel frames."""

    mel: torch.Tensor  # [n_mels, frames], frames <= the encoder's window
    alone: bool  # the whole clip is shorter than one chunk (convolved unpadded, as transformers does)


class AudioEncoder:
    """`tower` is transformers' Qwen3-Omni audio encoder (its modules and weights are used as they are).

    `max_windows`: the most windows one forward takes (larger calls are split); `graphs`: capture each
    bucket as a CUDA graph (CUDA devices only).
    """

    def __init__(self, tower: Any, device: torch.device, max_windows: int, graphs: bool = False) -> None:
        cfg = tower.config
        self.tower = tower
        self.device = device
        self.dtype: torch.dtype = tower.conv2d1.weight.dtype
        self.n_mels: int = cfg.num_mel_bins
        self.chunk: int = 2 * cfg.n_window  # frames per convolution chunk
        self.window_chunks: int = max(1, cfg.n_window_infer // self.chunk)
        self.window = self.chunk * self.window_chunks  # frames per attention window
        self.chunk_tokens = conv_tokens(self.chunk)
        self.heads: int = cfg.encoder_attention_heads
        self.conv_batch: int = cfg.conv_chunksize
        self.max_windows = max_windows
        self.window_sizes = window_buckets(max_windows)
        if graphs and device.type != "cuda":
            raise ValueError("CUDA graphs of the audio encoder need a CUDA device")
        self.graphs = StepGraphs(self._forward, "audio encoder", graphs)
        self.free_memory: Callable[[], int | None] = lambda: free_bytes(device)
        self.windows_encoded = 0  # since the start: a figure for tests and stats

    def _stop_capturing(self, keys: list[tuple[int, int]], why: str) -> None:
        """Leave the keys not captured yet to run eagerly (the wider ones: they need more memory still)."""
        left = [k for k in keys if k not in self.graphs.captured]
        self.graphs.eager.update(left)
        log.warning(
            "audio encoder: %d of %d CUDA graphs captured; %d (windows x chunks from %s on) run eagerly, %s",
            len(self.graphs.captured),
            len(keys),
            len(left),
            left[0],
            why,
        )

    # ---- clips and windows ----------------------------------------------------------------------
    def tokens(self, frames: int) -> int:
        """Tokens (audio placeholders) of a clip of `frames` frames."""
        full, rest = divmod(frames, self.chunk)
        return full * self.chunk_tokens + conv_tokens(rest)

    def windows(self, mel: np.ndarray | torch.Tensor) -> list[Window]:
        """A clip's log-mel [n_mels, frames] cut into attention windows, in order."""
        mel = torch.as_tensor(mel)
        frames = mel.shape[1]
        if mel.ndim != 2 or mel.shape[0] != self.n_mels or frames == 0:
            raise ValueError(f"audio features must be [{self.n_mels}, frames > 0], got {tuple(mel.shape)}")
        alone = frames < self.chunk
        return [Window(mel[:, a : a + self.window], alone) for a in range(0, frames, self.window)]

    def encode_clips(self, mels: list[np.ndarray] | list[torch.Tensor]) -> list[torch.Tensor]:
        """Each clip's encoder output [tokens, out_dim], all clips' windows batched together."""
        per_clip = [self.windows(m) for m in mels]
        outs = self([w for ws in per_clip for w in ws])
        clips, at = [], 0
        for ws in per_clip:
            clips.append(torch.cat(outs[at : at + len(ws)]))
            at += len(ws)
        return clips

    # ---- the batched forward --------------------------------------------------------------------
    @torch.inference_mode()
    def __call__(self, windows: list[Window]) -> list[torch.Tensor]:
        """Each window's output [tokens, out_dim], in order; at most `max_windows` per forward."""
        outs: list[torch.Tensor] = []
        for at in range(0, len(windows), self.max_windows):
            outs += self._call(windows[at : at + self.max_windows])
        self.windows_encoded += len(windows)
        return outs

    def _call(self, windows: list[Window]) -> list[torch.Tensor]:
        frames = [w.mel.shape[1] for w in windows]
        rows = bucket(len(windows), self.window_sizes)
        chunks = -(-max(frames) // self.chunk)  # chunks of the longest window: every window's count
        mel = torch.zeros(rows, self.n_mels, chunks * self.chunk, dtype=self.dtype)
        for row, w in enumerate(windows):
            mel[row, :, : frames[row]] = w.mel
        inputs = {"mel": mel, **self._masks(windows, frames, rows, chunks)}
        inputs = {k: v.to(self.device, non_blocking=True) for k, v in inputs.items()}
        (out,) = self.graphs((rows, chunks), inputs, chunks=chunks)  # [rows, chunks * chunk_tokens, D]
        return [out[row, : self.tokens(n)] for row, n in enumerate(frames)]

    def _masks(
        self, windows: list[Window], frames: list[int], rows: int, chunks: int
    ) -> dict[str, torch.Tensor]:
        """The convolutions' masks [rows * chunks, 1, 1, t] (0 past an `alone` clip's end, else 1) and
        the attention's key mask [rows, 1, 1, chunks * chunk_tokens] (the window's tokens; every key of
        a padding row, so that its softmax stays finite)."""
        t1 = (self.chunk - 1) // 2 + 1
        t2 = (t1 - 1) // 2 + 1
        conv1 = torch.ones(rows, chunks, t1, dtype=self.dtype)
        conv2 = torch.ones(rows, chunks, t2, dtype=self.dtype)
        keys = torch.ones(rows, chunks * self.chunk_tokens, dtype=torch.bool)
        for row, (w, n) in enumerate(zip(windows, frames, strict=True)):
            keys[row, self.tokens(n) :] = False
            if w.alone:
                n1 = (n - 1) // 2 + 1
                conv1[row, 0, n1:] = 0
                conv2[row, 0, (n1 - 1) // 2 + 1 :] = 0
        return {
            "conv1": conv1.view(rows * chunks, 1, 1, t1),
            "conv2": conv2.view(rows * chunks, 1, 1, t2),
            "keys": keys.view(rows, 1, 1, -1),
        }

    def _forward(
        self, mel: torch.Tensor, conv1: torch.Tensor, conv2: torch.Tensor, keys: torch.Tensor, chunks: int
    ) -> tuple[torch.Tensor]:
        tower = self.tower
        rows = mel.shape[0]
        x = mel.view(rows, self.n_mels, chunks, self.chunk).transpose(1, 2)  # [rows, chunks, n_mels, chunk]
        x = x.reshape(rows * chunks, 1, self.n_mels, self.chunk)
        parts = []
        for at in range(0, x.shape[0], self.conv_batch):  # bounded activation memory, as transformers
            end = at + self.conv_batch
            h = F.gelu(tower.conv2d1(x[at:end])) * conv1[at:end]
            h = F.gelu(tower.conv2d2(h)) * conv2[at:end]
            parts.append(F.gelu(tower.conv2d3(h)))
        h = torch.cat(parts)  # [rows * chunks, C, f, chunk_tokens]
        c, f = h.shape[1], h.shape[2]
        h = tower.conv_out(h.permute(0, 3, 1, 2).reshape(-1, self.chunk_tokens, c * f))
        h = h + tower.positional_embedding.positional_embedding[: self.chunk_tokens].to(h.dtype)
        h = h.view(rows, chunks * self.chunk_tokens, -1)  # [rows, S, D]: each row one window
        for layer in tower.layers:
            h = self._layer(layer, h, keys)
        h = tower.proj2(tower.act(tower.proj1(tower.ln_post(h))))
        return (h,)

    def _layer(self, layer: Any, h: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """One encoder layer over whole windows: pre-norm attention within each window, then the MLP."""
        attn = layer.self_attn
        rows, s, d = h.shape
        x = layer.self_attn_layer_norm(h)
        q, k, v = (
            p(x).view(rows, s, self.heads, -1).transpose(1, 2)
            for p in (attn.q_proj, attn.k_proj, attn.v_proj)
        )
        a = F.scaled_dot_product_attention(
            q, k, v, attn_mask=keys, scale=attn.scaling
        )  # [rows, heads, S, hd]
        h = h + attn.out_proj(a.transpose(1, 2).reshape(rows, s, d))
        x = layer.fc2(layer.activation_fn(layer.fc1(layer.final_layer_norm(h))))
        h = h + x
        if h.dtype == torch.float16:  # as transformers: keep float16 activations finite
            limit = torch.finfo(h.dtype).max - 1000
            h = h.clamp(-limit, limit)
        return h

    def capture_all(self) -> None:
        """Capture every (windows, chunks) bucket's CUDA graph now, so none is captured while serving."""
        if not self.graphs.enabled:
            return
        began = time.perf_counter()
        keys = [(rows, chunks) for rows in self.window_sizes for chunks in range(1, self.window_chunks + 1)]
        try:
            for rows, chunks in keys:  # narrowest and shortest first: what fits goes in first
                free = self.free_memory()
                if free is not None and free < GRAPHS_LEAVE_BYTES:
                    self._stop_capturing(
                        keys, f"{free / GIB:.1f} GiB left on {self.device}, kept for the other stages"
                    )
                    return
                mel = torch.zeros(self.n_mels, chunks * self.chunk)
                self._call([Window(mel, False)] * rows)
        except torch.OutOfMemoryError as e:  # the wider ones need more still: those run eagerly
            self._stop_capturing(keys, f"no memory for their graphs ({str(e).splitlines()[0]})")
            return
        except RuntimeError as e:  # an op of the tower that cannot be captured: the same math, eager
            torch.cuda.synchronize(self.device)
            self.graphs.captured.clear()
            self.graphs.enabled = False
            log.warning("audio encoder: not graphed (%s); running eagerly", str(e).splitlines()[0])
            return
        log.info(
            "audio encoder: %d CUDA graphs captured in %.1f s (windows %s x chunks 1..%d)",
            len(self.graphs.captured),
            time.perf_counter() - began,
            list(self.window_sizes),
            self.window_chunks,
        )
