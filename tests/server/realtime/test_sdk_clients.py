"""The `openai` SDK's realtime clients as the README shows them, against a real server over the fake
engine: the beta client reaches a plain `ws://` server with `websocket_base_url`, speaks the beta
dialect, and gets the caller's transcript by its beta setting."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import numpy as np
import openai
import pytest

from tests.support.fake_engine import FakeServer, Script, serve_realtime
from tests.support.realtime_client import Recorder
from tests.support.speech import pcm16

TEXT = ("Hi", " there")


@pytest.fixture(scope="module")
def srv() -> Iterator[FakeServer]:
    with serve_realtime(Script(texts=TEXT, audio_chunks=1)) as s:
        yield s


async def test_the_beta_client_needs_only_websocket_base_url(srv: FakeServer) -> None:
    ws = srv.url.replace("http://", "ws://")
    client = openai.AsyncOpenAI(
        base_url=f"{srv.url}/v1", websocket_base_url=f"{ws}/v1", api_key="none", max_retries=0
    )
    async with client.beta.realtime.connect(model="omnivoice") as conn:
        rec = Recorder(conn)
        created = await rec.next("session.created")
        session = {
            "modalities": ["text"],
            "turn_detection": None,
            "input_audio_transcription": {"model": "x"},
        }
        await conn.session.update(session=session)  # type: ignore[arg-type]
        updated = await rec.next("session.updated")
        tone = 0.3 * np.sin(np.linspace(0, 900, 12000)).astype(np.float32)  # 0.5 s
        await conn.input_audio_buffer.append(audio=base64.b64encode(pcm16(tone)).decode())
        await conn.input_audio_buffer.commit()
        committed = await rec.next("input_audio_buffer.committed")
        await conn.response.create()
        done = await rec.next("response.done")
        heard = await rec.first("conversation.item.input_audio_transcription.completed")
        await rec.close()
    assert created.session.object == "realtime.session"  # the beta session object
    assert updated.session.modalities == ["text"] and updated.session.input_audio_transcription.model == "x"
    assert "conversation.item.created" in rec.types() and "response.text.delta" in rec.types()  # beta names
    assert done.response.status == "completed" and done.response.output[0].content[0].text == "".join(TEXT)
    assert heard.item_id == committed.item_id and heard.transcript == "".join(TEXT)
