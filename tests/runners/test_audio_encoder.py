"""The batched audio encoder: clips of any length in one padded call give what transformers'
`get_audio_features` gives each clip alone; a clip encoded window by window equals it encoded whole."""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import pytest
import torch

from omnivoice.models.loader import load_model
from omnivoice.runners.audio_encoder import (
    GRAPHS_LEAVE_BYTES,
    AudioEncoder,
    Window,
    audio_tower,
    conv_tokens,
    window_buckets,
)
from tests.support.cpu_graphs import CpuGraphs

# one frame; under a chunk (odd and even convolution lengths); exactly a chunk; a padded last chunk;
# exactly a window; a window and one frame; several windows and a short tail
FRAMES = [1, 37, 58, 100, 150, 800, 801, 1777]


@pytest.fixture(scope="module")
def thinker(tiny_checkpoint: Path):
    thinker = copy.deepcopy(load_model(tiny_checkpoint).model.thinker)
    # The tiny checkpoint's convolution biases are zero, which would hide the padding a short clip must
    # not see (a zero input stays zero): give them values, as a trained checkpoint has.
    g = torch.Generator().manual_seed(7)
    tower = audio_tower(thinker)
    with torch.no_grad():
        for conv in (tower.conv2d1, tower.conv2d2, tower.conv2d3):
            conv.bias.copy_(torch.randn(conv.bias.shape, generator=g))
    return thinker


def reference(thinker, mel: torch.Tensor) -> torch.Tensor:
    mask = torch.ones(1, mel.shape[1], dtype=torch.long)
    with torch.no_grad():
        return thinker.get_audio_features(mel[None], feature_attention_mask=mask).last_hidden_state


def clips(frames: list[int], seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(128, n, generator=g) for n in frames]


def test_clips_batched_in_one_call_equal_transformers_per_clip(thinker) -> None:
    encoder = AudioEncoder(audio_tower(thinker), torch.device("cpu"), max_windows=16)
    mels = clips(FRAMES)
    outs = encoder.encode_clips(mels)
    assert encoder.windows_encoded == sum(-(-n // 800) for n in FRAMES)  # in one call: 11 <= 16
    for n, mel, out in zip(FRAMES, mels, outs, strict=True):
        ref = reference(thinker, mel)
        assert out.shape == ref.shape == (encoder.tokens(n), 64), n
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-7, msg=f"{n} frames")


def test_a_short_clip_is_encoded_as_transformers_encodes_it_alone(thinker) -> None:
    """Beside a long clip, a clip under one chunk still sees zeros past its end in every convolution
    (without the `alone` masks it would see the convolutions of its zero padding)."""
    encoder = AudioEncoder(audio_tower(thinker), torch.device("cpu"), max_windows=4)
    short, long = clips([37, 900], seed=1)
    out_short, _ = encoder.encode_clips([short, long])
    torch.testing.assert_close(out_short, reference(thinker, short), rtol=1e-5, atol=1e-7)
    (unmasked,) = encoder([Window(short, alone=False)])
    assert not torch.allclose(unmasked, out_short, rtol=1e-5, atol=1e-7)


def test_windows_encoded_ahead_then_the_tail_equal_the_whole_clip(thinker) -> None:
    """What incremental encoding relies on: the windows of a clip's first part, encoded while it is
    spoken, and its tail, encoded once it ends, are the whole clip's output."""
    encoder = AudioEncoder(audio_tower(thinker), torch.device("cpu"), max_windows=2)
    (mel,) = clips([2 * 800 + 333], seed=2)
    whole = reference(thinker, mel)
    windows = encoder.windows(mel)
    ahead = encoder(windows[:1]) + encoder(windows[1:2])  # one completed window at a time
    tail = encoder(windows[2:])
    torch.testing.assert_close(torch.cat(ahead + tail), whole, rtol=1e-5, atol=1e-7)
    # the same windows, another batch: a window's output does not depend on its neighbours
    mixed = encoder([*encoder.windows(clips([50], seed=3)[0]), windows[2]])
    torch.testing.assert_close(mixed[1], tail[0], rtol=1e-5, atol=1e-7)


def test_calls_larger_than_max_windows_are_split(thinker) -> None:
    encoder = AudioEncoder(audio_tower(thinker), torch.device("cpu"), max_windows=2)
    mels = clips([100, 2000, 801], seed=4)  # 1 + 3 + 2 windows: three calls
    for mel, out in zip(mels, encoder.encode_clips(mels), strict=True):
        torch.testing.assert_close(out, reference(thinker, mel), rtol=1e-5, atol=1e-7)


def test_buckets_and_token_counts() -> None:
    assert window_buckets(16) == (1, 2, 4, 8, 16)
    assert window_buckets(12) == (1, 2, 4, 8, 12)
    assert [conv_tokens(n) for n in (0, 1, 8, 9, 100)] == [0, 1, 1, 2, 13]


def test_bad_features_are_refused(thinker) -> None:
    encoder = AudioEncoder(audio_tower(thinker), torch.device("cpu"), max_windows=2)
    with pytest.raises(ValueError, match="128, frames > 0"):
        encoder.windows(torch.zeros(80, 10))
    with pytest.raises(ValueError, match="128, frames > 0"):
        encoder.windows(torch.zeros(128, 0))
    with pytest.raises(ValueError, match="CUDA"):
        AudioEncoder(audio_tower(thinker), torch.device("cpu"), max_windows=2, graphs=True)


class ShortOfMemory(CpuGraphs):
    """Graphs that find no memory from key `full` on, as a GPU beside a full memory does."""

    def __init__(self, fn, full: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
        super().__init__(fn, "audio encoder")
        self.full = full

    def _capture(self, key, inputs, static):  # type: ignore[no-untyped-def]
        if key >= self.full:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 376.00 MiB")
        return super()._capture(key, inputs, static)


def test_graphs_that_do_not_fit_run_eagerly_and_the_rest_stay_captured(thinker) -> None:
    encoder = AudioEncoder(audio_tower(thinker), torch.device("cpu"), max_windows=4)
    encoder.graphs = graphs = ShortOfMemory(encoder._forward, full=(4, 1))
    encoder.capture_all()
    keys = [(r, c) for r in encoder.window_sizes for c in range(1, encoder.window_chunks + 1)]
    assert set(graphs.captured) == {k for k in keys if k < (4, 1)} and graphs.captured
    assert graphs.eager == {k for k in keys if k >= (4, 1)} and graphs.enabled
    mels = clips([801, 1777, 37])  # 2 + 3 + 1 windows: one call of 4, one of 2
    outs = encoder.encode_clips(mels)
    for n, mel, out in zip([801, 1777, 37], mels, outs, strict=True):
        torch.testing.assert_close(out, reference(thinker, mel), rtol=1e-5, atol=1e-7, msg=f"{n} frames")
    assert set(graphs.captured) == {k for k in keys if k < (4, 1)}  # no capture tried while encoding


def test_graphs_stop_short_of_the_memory_the_other_stages_need(thinker, caplog) -> None:  # type: ignore[no-untyped-def]
    encoder = AudioEncoder(audio_tower(thinker), torch.device("cpu"), max_windows=4)
    encoder.graphs = graphs = CpuGraphs(encoder._forward, "audio encoder")
    # each capture takes 256 MiB: four start at or above the floor, the fifth would start under it
    free = [GRAPHS_LEAVE_BYTES + 3 * (256 << 20)]

    def take() -> int:
        left = free[0]
        free[0] -= 256 << 20
        return left

    encoder.free_memory = take
    with caplog.at_level(logging.WARNING, logger="omnivoice.runners.audio_encoder"):
        encoder.capture_all()
    keys = [(r, c) for r in encoder.window_sizes for c in range(1, encoder.window_chunks + 1)]
    assert graphs.order == keys[:4] and graphs.eager == set(keys[4:])
    assert "kept for the other stages" in caplog.text
    mels = clips([801, 1777, 37])
    for n, mel, out in zip([801, 1777, 37], mels, encoder.encode_clips(mels), strict=True):
        torch.testing.assert_close(out, reference(thinker, mel), rtol=1e-5, atol=1e-7, msg=f"{n} frames")
