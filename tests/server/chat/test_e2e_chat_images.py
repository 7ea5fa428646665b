"""End to end: images in chat messages through the real engine (the tiny model's vision tower) behind a
real server, driven by the `openai` SDK: a data URL part is answered and reaches the thinker's
prompt; a remote URL, an undecodable image and one over the pixel limit are refused with a 400 that
names the field."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from PIL import Image

from tests.support.serve import serve_tiny

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(tiny_checkpoint: Path) -> Iterator[openai.OpenAI]:
    with serve_tiny(tiny_checkpoint) as st:
        yield openai.OpenAI(base_url=f"{st.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def data_url(width: int, height: int, fmt: str = "PNG", mime: str = "image/png") -> str:
    pixels = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt)
    return f"data:{mime};base64,{base64.b64encode(buffer.getvalue()).decode()}"


def ask(client: openai.OpenAI, *parts: dict[str, Any]) -> Any:
    content = [{"type": "text", "text": "What is in the picture?"}, *parts]
    return client.chat.completions.create(
        model="omnivoice", messages=[{"role": "user", "content": content}], max_tokens=5, temperature=0.0
    )


def image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url, "detail": "auto"}}


@pytest.mark.parametrize(
    ("fmt", "mime"), [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("WEBP", "image/webp")]
)
def test_an_image_part_is_answered_and_reaches_the_prompt(client: openai.OpenAI, fmt: str, mime: str) -> None:
    plain = ask(client)
    seen = ask(client, image(data_url(96, 64, fmt, mime)))  # 4 x 6 patches: 6 placeholders
    assert seen.choices[0].message.content is not None and seen.usage is not None and plain.usage is not None
    assert seen.usage.prompt_tokens == plain.usage.prompt_tokens + 6 + 2  # the run and its two tags


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("https://example.com/cat.png", "fetches no https URL"),
        ("data:image/png;base64,bm90IGFuIGltYWdl", "not a readable image/png image"),
        ("data:image/png;base64,***", "not valid base64"),
        ("data:image/gif;base64,R0lGODlh", "unsupported image type 'image/gif'"),
    ],
)
def test_bad_image_urls_are_a_400_naming_the_field(client: openai.OpenAI, url: str, error: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, image(url))
    body: Any = caught.value.body
    assert error in body["message"] and body["param"] == "messages[0].content[1].image_url.url"
    assert body["code"] == "invalid_image"


def test_an_image_over_the_pixel_limit_is_refused_before_decoding(client: openai.OpenAI) -> None:
    buffer = io.BytesIO()
    Image.new("L", (5000, 4000)).save(buffer, format="PNG")  # small file, 20 M pixels
    url = f"data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}"
    with pytest.raises(openai.BadRequestError, match="the limit is 16777216 pixels"):
        ask(client, image(url))


def test_an_image_in_an_assistant_message_is_refused(client: openai.OpenAI) -> None:
    messages: Any = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [image(data_url(32, 32))]},
        {"role": "user", "content": "and?"},
    ]
    with pytest.raises(openai.BadRequestError, match="must be text"):
        client.chat.completions.create(model="omnivoice", messages=messages, max_tokens=2)
