"""How a stream of codec frames is cut into vocoder chunks, and the window lengths that result.

Chunk k of a stream covers `chunk_frames(cfg, k)` new frames (the last chunk of a finished stream may
be shorter) and is decoded together with up to `left_context` frames before it. The lengths of the
windows of full chunks are therefore a short fixed list: `window_lengths(cfg)`. Every other window
(a final, partial chunk) is shorter than the longest one, so padding windows up to the next listed
length covers everything the runner decodes, and full chunks are never padded.
"""

from __future__ import annotations

from omnivoice.config import ChunkConfig


def chunk_frames(cfg: ChunkConfig, index: int) -> int:
    """New frames in chunk `index` of a stream (0: the first) when enough frames have arrived."""
    if cfg.ramp:
        return min(cfg.frames, cfg.first_frames * 2**index)
    return cfg.first_frames if index == 0 else cfg.frames


def window_lengths(cfg: ChunkConfig) -> tuple[int, ...]:
    """Frames decoded (left context + chunk) by every full chunk of a stream, ascending.

    The list ends with the steady-state window `frames + left_context`, the longest there is.
    """
    lengths: set[int] = set()
    decoded = index = 0
    steady = cfg.frames + cfg.left_context
    while True:
        size = chunk_frames(cfg, index)
        window = size + min(decoded, cfg.left_context)
        lengths.add(window)
        if window == steady:
            return tuple(sorted(lengths))
        decoded += size
        index += 1
