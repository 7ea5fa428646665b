"""Images into the thinker's vision patches, as Qwen3-Omni's image processor (Qwen2-VL's) prepares them.

An RGB image is resized (bicubic) so that both sides are multiples of patch_size * merge_size and its
pixel count lies in [min_pixels, max_pixels], keeping the aspect ratio as closely as that allows;
rescaled to [0, 1], normalized with the checkpoint's mean and std, then cut into patches: each patch
row holds channels x temporal_patch_size x patch x patch values (a still image is repeated over the
temporal patch), the rows ordered so that each merge_size x merge_size block of neighbouring patches is
contiguous (the vision tower merges each block into one token).

The settings are read from the checkpoint's preprocessor_config.json, falling back to the vision
tower's patch sizes and the values of Qwen3-Omni's released processor.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MAX_ASPECT_RATIO = 200  # the processor refuses longer strips


class ImageError(ValueError):
    """The image cannot be turned into vision patches (its shape or aspect ratio)."""


@dataclass(frozen=True)
class ImageSettings:
    patch_size: int = 16
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 4 * 4096
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @classmethod
    def from_checkpoint(cls, path: Path | None, vision: Any | None) -> ImageSettings:
        """The settings of the checkpoint at `path` (its preprocessor_config.json) with the vision
        config `vision` supplying the patch sizes the file leaves out."""
        raw: dict[str, Any] = {}
        file = None if path is None else Path(path) / "preprocessor_config.json"
        if file is not None and file.is_file():
            raw = json.loads(file.read_text())
        size = raw.get("size") or {}
        default = cls()

        def pick(key: str, vision_key: str | None, fallback: Any) -> Any:
            if key in raw:
                return raw[key]
            if vision is not None and vision_key is not None and hasattr(vision, vision_key):
                return getattr(vision, vision_key)
            return fallback

        return cls(
            patch_size=int(pick("patch_size", "patch_size", default.patch_size)),
            merge_size=int(pick("merge_size", "spatial_merge_size", default.merge_size)),
            temporal_patch_size=int(
                pick("temporal_patch_size", "temporal_patch_size", default.temporal_patch_size)
            ),
            min_pixels=int(raw.get("min_pixels", size.get("shortest_edge", default.min_pixels))),
            max_pixels=int(raw.get("max_pixels", size.get("longest_edge", default.max_pixels))),
            mean=tuple(raw.get("image_mean", default.mean)),  # type: ignore[arg-type]
            std=tuple(raw.get("image_std", default.std)),  # type: ignore[arg-type]
        )


def target_size(height: int, width: int, s: ImageSettings) -> tuple[int, int]:
    """The (height, width) an image is resized to: multiples of s.factor, pixels within the limits."""
    if min(height, width) <= 0:
        raise ImageError(f"the image has no pixels ({width}x{height})")
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ImageError(f"the image's aspect ratio is over {MAX_ASPECT_RATIO} ({width}x{height})")
    f = s.factor
    h, w = round(height / f) * f, round(width / f) * f
    if h * w > s.max_pixels:
        scale = math.sqrt(height * width / s.max_pixels)
        h, w = max(f, math.floor(height / scale / f) * f), max(f, math.floor(width / scale / f) * f)
    elif h * w < s.min_pixels:
        scale = math.sqrt(s.min_pixels / (height * width))
        h, w = math.ceil(height * scale / f) * f, math.ceil(width * scale / f) * f
    return h, w


def image_patches(rgb: np.ndarray, s: ImageSettings) -> tuple[np.ndarray, tuple[int, int, int]]:
    """An RGB image [H, W, 3] uint8 -> its patches [h * w, 3 * t * p * p] float32 and grid (1, h, w)."""
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise ImageError(f"expected an RGB uint8 image [H, W, 3], got {rgb.dtype} {rgb.shape}")
    from PIL import Image  # lazily: prompts without images never need it

    height, width = target_size(rgb.shape[0], rgb.shape[1], s)
    resized = np.asarray(Image.fromarray(rgb).resize((width, height), Image.Resampling.BICUBIC))
    scaled = resized.astype(np.float64) * (1 / 255)  # as the processor rescales: in float64, then float32
    pixels = scaled.astype(np.float32).transpose(2, 0, 1)  # [3, H, W]
    mean = np.asarray(s.mean, dtype=np.float32).reshape(3, 1, 1)
    std = np.asarray(s.std, dtype=np.float32).reshape(3, 1, 1)
    pixels = (pixels - mean) / std
    p, m, t = s.patch_size, s.merge_size, s.temporal_patch_size
    gh, gw = height // p, width // p
    blocks = pixels.reshape(3, gh // m, m, p, gw // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)
    # [gh/m, gw/m, m, m, 3, p, p] -> a still image repeated over the temporal patch
    blocks = np.broadcast_to(blocks[:, :, :, :, :, None], (*blocks.shape[:5], t, p, p))
    return np.ascontiguousarray(blocks.reshape(gh * gw, 3 * t * p * p), dtype=np.float32), (1, gh, gw)


def decode_rgb(data: bytes) -> np.ndarray:
    """An encoded image (PNG, JPEG, WebP) -> RGB pixels [H, W, 3] uint8; ImageError if unreadable."""
    import io

    from PIL import Image  # lazily: prompts without images never need it

    try:
        with Image.open(io.BytesIO(data)) as img:
            return np.asarray(img.convert("RGB"), dtype=np.uint8)
    except (Image.DecompressionBombError, OSError, SyntaxError, ValueError):
        raise ImageError("the image data cannot be decoded") from None


def tokens_for_size(height: int, width: int, s: ImageSettings) -> int:
    """Placeholder tokens of an image of `height` x `width` pixels, from its size alone."""
    h, w = target_size(height, width, s)
    return (h // s.patch_size) * (w // s.patch_size) // (s.merge_size**2)


def image_token_count(grid: tuple[int, int, int], s: ImageSettings) -> int:
    """Placeholder tokens of an image of patch grid `grid`: one per merge_size x merge_size block."""
    return grid[0] * grid[1] * grid[2] // (s.merge_size**2)
