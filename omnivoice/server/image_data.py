"""Images of chat and realtime content parts: base64 data URLs (PNG, JPEG, WebP) read to their
encoded bytes and the size their header gives.

The server fetches nothing: a remote URL is refused. Nothing is decoded here: the size is checked
against the limit, and requests and sessions hold the encoded bytes (small for a solid image that
would expand to hundreds of megabytes); the prompt builder decodes each image, one at a time, once
the tokens its size makes are known to fit.
"""

from __future__ import annotations

import base64
import binascii
import io

from omnivoice.types import ImagePart

FORMATS = {"image/png": "PNG", "image/jpeg": "JPEG", "image/jpg": "JPEG", "image/webp": "WEBP"}


class ImageDecodeError(ValueError):
    """The image URL is not a supported data URL, or its data is not a readable image."""


def read_image_url(url: str, max_pixels: int) -> ImagePart:
    """`data:image/png;base64,...` (or jpeg, webp) -> its encoded bytes and size (header only)."""
    if not url.startswith("data:"):
        scheme = url.split(":", 1)[0] if ":" in url else "a bare"
        raise ImageDecodeError(
            f"only base64 data URLs are accepted (data:image/png;base64,...); the server fetches no "
            f"{scheme} URL"
        )
    head, sep, data = url.partition(",")
    if not (sep and head.endswith(";base64")):
        raise ImageDecodeError("the image URL must be a base64 data URL (data:image/png;base64,...)")
    mime = head[len("data:") : -len(";base64")].lower()
    if mime not in FORMATS:
        raise ImageDecodeError(
            f"unsupported image type {mime!r}; send one of {', '.join(sorted(set(FORMATS)))}"
        )
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ImageDecodeError("the image data is not valid base64") from None
    from PIL import Image, UnidentifiedImageError  # lazily: only requests with images need it

    unreadable = (UnidentifiedImageError, Image.DecompressionBombError, OSError, SyntaxError, ValueError)

    try:
        with Image.open(io.BytesIO(raw), formats=[FORMATS[mime]]) as img:
            width, height = img.size
            if width * height > max_pixels:
                raise ImageDecodeError(
                    f"the image is {width}x{height} pixels; the limit is {max_pixels} pixels"
                )
            img.verify()  # the file's structure (chunk checksums), without decoding its pixels
    except unreadable as e:
        if isinstance(e, ImageDecodeError):
            raise
        raise ImageDecodeError(f"the data is not a readable {mime} image") from None
    return ImagePart(data=raw, width=width, height=height)
