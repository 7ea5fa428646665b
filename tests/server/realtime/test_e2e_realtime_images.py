"""End to end: `input_image` content in realtime user items (the GA shape), through the tiny model's
vision tower behind a real server, driven by the `openai` SDK: the image reaches the thinker's prompt
and the response is answered; a remote URL or a bad image is an `error` event naming the field."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tests.support.realtime_client import Recorder, client
from tests.support.serve import ServerThread, serve_tiny

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tiny_checkpoint: Path) -> Iterator[ServerThread]:
    with serve_tiny(tiny_checkpoint) as st:
        yield st


def data_url(width: int, height: int) -> str:
    pixels = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return f"data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}"


async def answer(rec: Recorder, conn: Any, content: list[dict[str, Any]]) -> Any:
    item = {"type": "message", "role": "user", "content": content}
    await conn.send_raw(json.dumps({"type": "conversation.item.create", "item": item}))
    await rec.next("conversation.item.done")
    response = {"output_modalities": ["text"], "max_output_tokens": 4}
    await conn.send_raw(json.dumps({"type": "response.create", "response": response}))
    return (await rec.next("response.done")).response


async def test_an_input_image_is_answered_and_reaches_the_prompt(server: ServerThread) -> None:
    text = {"type": "input_text", "text": "What is in the picture?"}
    image = {"type": "input_image", "image_url": data_url(96, 64), "detail": "auto"}  # 6 placeholders
    async with client(server.base_url).realtime.connect(model="omnivoice") as conn:
        rec = Recorder(conn)
        await rec.next("session.created")
        plain = await answer(rec, conn, [text])
        seen = await answer(rec, conn, [text, image])
        item_id = seen.output[0].id
        await rec.close()
    assert seen.status == "completed" and seen.output[0].content[0].text is not None
    # the second prompt holds the first turn, its answer, and the new turn with the image's run
    first_turn = plain.usage.input_tokens
    assert seen.usage.input_tokens > first_turn + plain.usage.output_tokens + 6 + 2 and item_id


async def test_an_image_item_is_shown_and_retrieved(server: ServerThread) -> None:
    url = data_url(32, 32)
    item = {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": url}]}
    async with client(server.base_url).realtime.connect(model="omnivoice") as conn:
        rec = Recorder(conn)
        await rec.next("session.created")
        await conn.send_raw(json.dumps({"type": "conversation.item.create", "item": item}))
        done = (await rec.next("conversation.item.done")).item
        await conn.send_raw(json.dumps({"type": "conversation.item.retrieve", "item_id": done.id}))
        retrieved = await rec.next("conversation.item.retrieved")
        await rec.close()
    assert done.content[0].type == "input_image"
    assert retrieved.item.content[0].image_url == url


@pytest.mark.parametrize(
    ("part", "param", "error"),
    [
        (
            {"type": "input_image", "image_url": "https://example.com/a.png"},
            "image_url",
            "fetches no https URL",
        ),
        ({"type": "input_image", "image_url": "data:image/png;base64,AAAA"}, "image_url", "not a readable"),
        ({"type": "input_image"}, "image_url", "Missing required parameter"),
    ],
)
async def test_bad_images_are_an_error_naming_the_field(
    server: ServerThread, part: dict[str, Any], param: str, error: str
) -> None:
    item = {"type": "message", "role": "user", "content": [part]}
    async with client(server.base_url).realtime.connect(model="omnivoice") as conn:
        rec = Recorder(conn)
        await rec.next("session.created")
        await conn.send_raw(json.dumps({"type": "conversation.item.create", "item": item}))
        got = (await rec.next("error")).error
        await rec.close()
    assert got.param == f"item.content[0].{param}" and error in got.message
