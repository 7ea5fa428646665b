"""Vocoder chunk sizes and the window lengths they produce (the shapes a GPU pads windows to)."""

from __future__ import annotations

from omnivoice.config import ChunkConfig
from omnivoice.runners.chunking import chunk_frames, window_lengths


def test_chunks_ramp_up_to_the_steady_size() -> None:
    ramp = ChunkConfig(first_frames=4, frames=25, left_context=25)
    assert [chunk_frames(ramp, k) for k in range(6)] == [4, 8, 16, 25, 25, 25]
    flat = ChunkConfig(first_frames=4, frames=25, left_context=25, ramp=False)
    assert [chunk_frames(flat, k) for k in range(4)] == [4, 25, 25, 25]


def test_window_lengths_of_full_chunks() -> None:
    # left context grows with what was decoded (0, 4, 12, then capped at 25)
    assert window_lengths(ChunkConfig()) == (4, 12, 28, 50)
    assert window_lengths(ChunkConfig(ramp=False)) == (4, 29, 50)
    assert window_lengths(ChunkConfig(left_context=0)) == (4, 8, 16, 25)
    assert window_lengths(ChunkConfig(first_frames=25, frames=25, left_context=25)) == (25, 50)
    assert window_lengths(ChunkConfig(left_context=100)) == (4, 12, 28, 53, 78, 103, 125)
    assert window_lengths(ChunkConfig(first_frames=1, frames=1, left_context=3)) == (1, 2, 3, 4)


def test_every_full_chunk_window_is_listed() -> None:
    for cfg in (
        ChunkConfig(),
        ChunkConfig(ramp=False),
        ChunkConfig(first_frames=3, frames=10, left_context=7),
        ChunkConfig(first_frames=5, frames=12, left_context=40, ramp=False),
    ):
        lengths = window_lengths(cfg)
        decoded = 0
        for k in range(40):
            size = chunk_frames(cfg, k)
            assert size + min(decoded, cfg.left_context) in lengths
            decoded += size
        assert lengths[-1] == cfg.frames + cfg.left_context  # the longest window of all
