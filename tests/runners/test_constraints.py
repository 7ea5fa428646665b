"""Grammar-constrained decoding in the thinker runner, on a random-weight model: whatever the weights
say, a constrained answer is JSON of its schema, or a tool call of the named function, and ends with
the model's end token; an unconstrained request beside it decodes exactly as it does alone.

The model is the shrunk dummy (the real vocabulary, `<tool_call>` included, tiny layers).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import jsonschema
import pytest

from omnivoice.config import parse_profile
from omnivoice.messages import NewRequest, StageFinished, TokenOutput
from omnivoice.models.dummy import REDUCED, DummySource
from omnivoice.models.dummy_tokenizer import load_dummy_processor_parts
from omnivoice.models.grammars import json_schema_grammar, tool_call_grammar
from omnivoice.runners.factory import build_runners
from omnivoice.types import GenerationRequest, Grammar, Prompt, Sampling

SOURCE = DummySource("qwen3-omni-30b-a3b", overrides=REDUCED)
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
    },
    "required": ["city", "unit", "days"],
    "additionalProperties": False,
}
# <|im_start|>user\n ... <|im_end|>\n<|im_start|>assistant\n, with a few ordinary ids as the question
PROMPT = Prompt((151644, 872, 198, 3838, 374, 279, 9104, 30, 151645, 198, 151644, 77091, 198))
MAX_TOKENS = 120


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    """The thinker runner and the served tokenizer."""
    cache = tmp_path_factory.mktemp("omnivoice-cache")
    stage = {"device": "cpu", "worker": "thread", "max_batch": 4, "max_seq_len": 256}
    profile = parse_profile({"model": {"cache_dir": str(cache)}, "stages": {"thinker": stage}})
    thinker = build_runners(profile, SOURCE, only=(("thinker", 0),))[("thinker", 0)]
    return thinker, load_dummy_processor_parts(cache)[0]


def _request(rid: str, grammar: Grammar | None = None, **sampling: Any) -> GenerationRequest:
    params = Sampling(max_tokens=MAX_TOKENS, grammar=grammar, **sampling)
    return GenerationRequest(rid, PROMPT, want_audio=False, thinker=params)


def _run(thinker: Any, requests: list[GenerationRequest]) -> dict[str, tuple[list[int], StageFinished]]:
    """Each request's tokens and how it finished, the runner stepped until it is idle."""
    tokens: dict[str, list[int]] = {r.request_id: [] for r in requests}
    finished: dict[str, StageFinished] = {}
    for r in requests:
        thinker.accept(NewRequest(r))
    while thinker.has_work():
        for out in thinker.step():
            if isinstance(out, TokenOutput):
                tokens[out.request_id] += out.token_ids
            elif isinstance(out, StageFinished):
                finished[out.request_id] = out
    assert not thinker.constraints.matchers  # every request's matcher went with it
    return {rid: (tokens[rid], finished[rid]) for rid in tokens}


def _answer(tokenizer: Any, tokens: list[int], finished: StageFinished) -> str:
    """The text before the end token, which must be the answer's last token."""
    assert finished.reason == "stop", finished
    assert tokens[-1] in (151645, 151643)
    return tokenizer.decode(tokens[:-1], skip_special_tokens=False)


@pytest.mark.parametrize("sampling", [{}, {"temperature": 1.0, "seed": 7}, {"temperature": 1.5, "seed": 3}])
def test_a_constrained_answer_is_json_of_its_schema(built, sampling: dict[str, Any]) -> None:
    thinker, tokenizer = built
    result = _run(thinker, [_request("json", json_schema_grammar(WEATHER), **sampling)])
    text = _answer(tokenizer, *result["json"])
    jsonschema.validate(json.loads(text), WEATHER)
    assert json.dumps(json.loads(text), ensure_ascii=False) == text  # as json.dumps writes it


def test_a_tool_call_grammar_gives_a_call_of_the_named_function(built) -> None:
    thinker, tokenizer = built
    grammar = tool_call_grammar({"get_weather": WEATHER}, parallel=False)
    result = _run(thinker, [_request("call", grammar, temperature=1.0, seed=11)])
    tokens, finished = result["call"]
    start, end = tokenizer.convert_tokens_to_ids(["<tool_call>", "</tool_call>"])
    assert tokens[0] == start and tokens[-2] == end  # the special tokens, then the end token
    text = _answer(tokenizer, tokens, finished)
    assert text.startswith("<tool_call>\n") and text.endswith("\n</tool_call>")
    call = json.loads(text.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
    assert call["name"] == "get_weather" and set(call) == {"name", "arguments"}
    jsonschema.validate(call["arguments"], WEATHER)


@pytest.mark.parametrize("overlap", [False, True])
def test_an_unconstrained_neighbour_decodes_as_it_does_alone(built, overlap: bool) -> None:
    thinker, tokenizer = built
    thinker.overlap = overlap
    try:
        alone = _run(thinker, [_request("free")])["free"][0]
        both = _run(thinker, [_request("json", json_schema_grammar(WEATHER)), _request("free")])
    finally:
        thinker.overlap = False
    assert both["free"][0] == alone
    jsonschema.validate(json.loads(_answer(tokenizer, *both["json"])), WEATHER)


def test_overlapped_steps_constrain_as_synchronous_ones(built) -> None:
    thinker, _ = built
    requests = [_request(f"c{i}", json_schema_grammar(WEATHER), temperature=1.0, seed=i) for i in range(3)]
    plain = _run(thinker, requests)
    thinker.overlap = True
    try:
        overlapped = _run(thinker, requests)
    finally:
        thinker.overlap = False
    assert {rid: t for rid, (t, _) in overlapped.items()} == {rid: t for rid, (t, _) in plain.items()}


def test_min_tokens_yield_to_the_grammar(built) -> None:
    thinker, tokenizer = built
    request = _request("json", json_schema_grammar(WEATHER), min_tokens=MAX_TOKENS)
    jsonschema.validate(json.loads(_answer(tokenizer, *_run(thinker, [request])["json"])), WEATHER)


def test_a_grammar_that_does_not_compile_is_refused_on_arrival(built) -> None:
    thinker, _ = built
    for grammar, message in [
        (Grammar("json_schema", '{"type": "foo"}'), "Invalid type: foo"),
        (Grammar("lark", "start: <no_such_token>"), "unknown special token"),
    ]:
        with pytest.raises(ValueError, match=message):
            thinker.accept(NewRequest(_request("bad", grammar)))
    assert not thinker.waiting and not thinker.constraints.matchers


def test_an_aborted_constrained_request_leaves_nothing_behind(built) -> None:
    thinker, _ = built
    thinker.accept(NewRequest(_request("json", json_schema_grammar(WEATHER))))
    thinker.accept(NewRequest(_request("free")))
    for _ in range(3):
        thinker.step()
    thinker.abort("json")
    assert "json" not in thinker.constraints.matchers
    while thinker.has_work():
        thinker.step()
    assert not thinker.running and not thinker.constraints.matchers


def test_a_constrained_turn_leaves_a_reusable_prefix(built) -> None:
    thinker, tokenizer = built
    first = replace(_request("t1", json_schema_grammar(WEATHER)), cache_key="conv")
    tokens, _ = _run(thinker, [first])["t1"]
    cached = thinker.stats().cached_tokens
    follow = Prompt(PROMPT.input_ids + tuple(tokens) + (198, 151644, 872, 198, 3838, 151645, 198))
    second = replace(_request("t2", json_schema_grammar(WEATHER)), prompt=follow, cache_key="conv")
    text = _answer(tokenizer, *_run(thinker, [second])["t2"])
    assert thinker.stats().cached_tokens - cached >= len(PROMPT.input_ids) + len(tokens) - 1
    jsonschema.validate(json.loads(text), WEATHER)
    thinker.prefix.drop("conv")
