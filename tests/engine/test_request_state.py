"""A request's outputs as the engine's dispatcher makes them from the thinker's tokens (the tiny
checkpoint's tokenizer): with functions offered, the text is split into what is said and the calls;
without, every token's text is said as before."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from omnivoice.engine.detokenizer import IncrementalDetokenizer
from omnivoice.engine.request_state import RequestState, queue_sink
from omnivoice.messages import StageFinished, TokenOutput
from omnivoice.models.loader import load_processor_parts
from omnivoice.types import (
    EngineOutput,
    FunctionSpec,
    GenerationRequest,
    Prompt,
    TextDelta,
    ToolCallDelta,
    ToolCallDone,
    Tools,
)

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ANSWER = "Sure.\n" + CALL


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint: Path):
    return load_processor_parts(tiny_checkpoint)[0]


async def outputs(tokenizer, tools: Tools | None, answer: str = ANSWER) -> list[EngineOutput]:
    """Feed the answer's tokens one by one, then the thinker's end, as the dispatcher does."""
    request = GenerationRequest("r1", Prompt((1, 2, 3)), want_audio=False, tools=tools)
    queue: asyncio.Queue[EngineOutput] = asyncio.Queue()
    sink = queue_sink(asyncio.get_running_loop(), queue)
    state = RequestState(request, sink, IncrementalDetokenizer(tokenizer))
    ids = tokenizer.encode(answer, add_special_tokens=False)
    for token in ids:
        state.on_tokens(TokenOutput("r1", (token,)))
    assert state.on_stage_finished(StageFinished("r1", "thinker", "stop", len(ids), 3)) == "stop"
    await asyncio.sleep(0)  # the outputs are queued with call_soon_threadsafe
    got = []
    while not queue.empty():
        got.append(queue.get_nowait())
    return got


async def test_offered_functions_split_the_text_into_said_text_and_calls(tokenizer) -> None:
    got = await outputs(tokenizer, Tools((FunctionSpec("get_weather"),)))
    deltas = [o for o in got if isinstance(o, TextDelta)]
    assert "".join(d.text for d in deltas) == "Sure."
    ids = tokenizer.encode(ANSWER, add_special_tokens=False)
    assert [t for d in deltas for t in d.token_ids] == ids  # every token is still counted, once
    calls = [o for o in got if isinstance(o, ToolCallDelta)]
    assert calls[0].name == "get_weather" and calls[0].arguments == ""
    assert "".join(c.arguments for c in calls) == '{"city": "Paris"}' and len(calls) > 2  # streamed
    (done,) = [o for o in got if isinstance(o, ToolCallDone)]
    assert done.call.arguments == '{"city": "Paris"}' and done.call.id == calls[0].call_id
    assert done.error is None and got.index(done) > got.index(calls[-1])


async def test_without_functions_the_text_is_all_said(tokenizer) -> None:
    got = await outputs(tokenizer, None)
    assert all(isinstance(o, TextDelta) for o in got)
    assert "".join(o.text for o in got if isinstance(o, TextDelta)) == ANSWER


async def test_without_parallel_calls_only_the_first_is_made(tokenizer) -> None:
    functions = (FunctionSpec("get_weather"),)
    both = await outputs(tokenizer, Tools(functions), ANSWER + "\n" + CALL)
    assert [o.index for o in both if isinstance(o, ToolCallDone)] == [0, 1]
    one = await outputs(tokenizer, Tools(functions, parallel=False), ANSWER + "\n" + CALL)
    assert {o.index for o in one if isinstance(o, ToolCallDelta | ToolCallDone)} == {0}
