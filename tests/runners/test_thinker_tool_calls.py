"""The talker never speaks a function call: in a request that offers functions, from the thinker's
`<tool_call>` token on the talker stage is handed no token of the request, its text ends there, and a
response that opens with a call has no audio (a request without functions has its text all said).
The tiny model is steered to write `<tool_call>` at a chosen step (greedy decoding, a logit bonus on
that one step); what the talker stage is given is observed as it is handed over."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from omnivoice.bench.engine_load import EngineLoadConfig, make_requests
from omnivoice.config import parse_profile
from omnivoice.messages import CodecChunk, NewRequest, StageFinished, ThinkerChunk, TokenOutput
from omnivoice.models.dummy import NEWLINE_ID
from omnivoice.runners.factory import build_runners
from omnivoice.types import FunctionSpec, GenerationRequest, Tools

TOKENS = 12  # the thinker writes this many tokens (no end token before)


@pytest.fixture(scope="module")
def runners(tiny_checkpoint: Path):
    stage = {"device": "cpu", "worker": "thread", "max_batch": 4, "max_seq_len": 512}
    sampling = {"sampling": {"temperature": 0.0}}
    profile = parse_profile(
        {
            "model": {"path": str(tiny_checkpoint)},
            "stages": {"thinker": {**stage, **sampling}, "talker": {**stage, **sampling}},
        }
    )
    built = build_runners(profile, tiny_checkpoint, only=(("thinker", 0), ("talker", 0)))
    cfg = EngineLoadConfig(1, 1, 0, prompt_tokens=24, text_tokens=TOKENS, audio_frames=40)
    (made,) = make_requests(profile, built[("thinker", 0)].spec, cfg, NEWLINE_ID, 1, "tools")
    request = replace(
        made,
        thinker=replace(made.thinker, min_tokens=TOKENS, max_tokens=TOKENS),
        tools=Tools((FunctionSpec("get_weather"),)),
    )
    return built[("thinker", 0)], built[("talker", 0)], request


class Steer:
    """Makes greedy decoding pick `token` at thinker step `at` (0: the prefill's first token)."""

    def __init__(self, thinker: Any, token: int, at: int) -> None:
        self.calls, self.token, self.at = 0, token, at
        self.handle = thinker.model.lm_head.register_forward_hook(self)

    def __call__(self, module, args, out):
        self.calls += 1
        if self.calls - 1 != self.at:
            return out
        out = out.clone()
        out[..., self.token] += 1e4
        return out


def run(thinker: Any, talker: Any, request: GenerationRequest) -> tuple[list, list[ThinkerChunk], int, list]:
    """The thinker's tokens, the chunks handed to the talker, the talker's frames, its StageFinished."""
    tokens: list[int] = []
    chunks: list[ThinkerChunk] = []
    talker_outs: list = []
    thinker.accept(NewRequest(request))
    while thinker.has_work() or talker.has_work():
        if thinker.has_work():
            for out in thinker.step():
                if isinstance(out, TokenOutput):
                    tokens += out.token_ids
                elif isinstance(out, ThinkerChunk):
                    chunks.append(out)
                    talker_outs += talker.accept(out)
        if talker.has_work():
            talker_outs += talker.step()
    frames = sum(out.frames.shape[1] for out in talker_outs if isinstance(out, CodecChunk))
    return tokens, chunks, frames, [out for out in talker_outs if isinstance(out, StageFinished)]


@pytest.mark.parametrize("at", [3, 7])
def test_the_talker_is_given_no_token_from_the_call_on(runners, at: int) -> None:
    thinker, talker, request = runners
    tool_call = thinker.spec.tool_call_id
    steer = Steer(thinker, tool_call, at)
    try:
        tokens, chunks, frames, finished = run(thinker, talker, replace(request, request_id=f"call-at-{at}"))
    finally:
        steer.handle.remove()
    assert len(tokens) == TOKENS and tokens[at] == tool_call  # the thinker writes the call on
    given = [t for c in chunks for t in c.token_ids]
    assert given == tokens[:at] and tool_call not in given
    assert [c.finished for c in chunks] == [False] * at + [True]  # its text ends at the call
    assert frames > 0 and [f.stage for f in finished] == ["talker"]  # what came before is spoken


def test_a_response_that_opens_with_a_call_has_no_audio(runners) -> None:
    thinker, talker, request = runners
    steer = Steer(thinker, thinker.spec.tool_call_id, 0)
    try:
        tokens, chunks, frames, finished = run(thinker, talker, replace(request, request_id="call-only"))
    finally:
        steer.handle.remove()
    assert tokens[0] == thinker.spec.tool_call_id and len(tokens) == TOKENS
    (chunk,) = chunks  # the prompt, and the end of the talker's text at once
    assert chunk.finished and chunk.token_ids == () and chunk.prompt_ids == request.prompt.input_ids
    assert frames == 0 and [(f.stage, f.reason) for f in finished] == [("talker", "stop")]


def test_without_functions_the_tag_is_text_the_talker_is_given(runners) -> None:
    thinker, talker, request = runners
    steer = Steer(thinker, thinker.spec.tool_call_id, 3)
    try:
        tokens, chunks, _, _ = run(thinker, talker, replace(request, request_id="no-tools", tools=None))
    finally:
        steer.handle.remove()
    assert [t for c in chunks for t in c.token_ids] == tokens[:-1]  # all but the last, as always
