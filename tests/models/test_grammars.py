"""The grammar builders: the text each accepts and rejects, checked with llguidance's own matcher over
the dummy tokenizer (the real Qwen3-Omni vocabulary's layout, `<tool_call>` included)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from llguidance import LLMatcher, LLTokenizer
from transformers import PreTrainedTokenizerBase

from omnivoice.models.dummy_tokenizer import build_dummy_tokenizer
from omnivoice.models.grammars import (
    compile_grammar,
    grammar_error,
    grammar_tokenizer,
    json_object_grammar,
    json_schema_grammar,
    tool_call_grammar,
)
from omnivoice.types import Grammar

END_IDS = (151645, 151643)  # <|im_end|>, <|endoftext|>
VOCAB = 152064  # the real thinker's logits: wider than the tokenizer
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
    "additionalProperties": False,
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'


@pytest.fixture(scope="module")
def tokenizers() -> tuple[PreTrainedTokenizerBase, LLTokenizer]:
    hf = build_dummy_tokenizer()
    return hf, grammar_tokenizer(hf, VOCAB, END_IDS)


def _matcher(tokenizers, grammar: Grammar, text: str = "") -> tuple[LLMatcher, bool]:
    hf, ll = tokenizers
    matcher = LLMatcher(ll, compile_grammar(grammar), log_level=0)
    ok = matcher.consume_tokens(hf.encode(text, add_special_tokens=False)) if text else True
    return matcher, ok


def _accepts(tokenizers, grammar: Grammar, text: str) -> bool:
    matcher, ok = _matcher(tokenizers, grammar, text)
    return ok and matcher.is_accepting()


def _allowed(matcher: LLMatcher) -> set[int]:
    bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
    return set(np.flatnonzero(bits[:VOCAB]).tolist())


def test_a_tool_call_is_the_hermes_form_between_the_special_tokens(tokenizers) -> None:
    hf, _ = tokenizers
    grammar = tool_call_grammar({"get_weather": WEATHER, "get_time": {}}, parallel=False)
    fresh, _ = _matcher(tokenizers, grammar)
    assert _allowed(fresh) == {hf.convert_tokens_to_ids("<tool_call>")}  # one token, never spelled out
    done, ok = _matcher(tokenizers, grammar, CALL)
    assert ok and done.is_accepting() and done.is_stopped()
    assert _allowed(done) == set(END_IDS)  # a finished call leaves only the model's end tokens
    assert _accepts(tokenizers, grammar, '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')


@pytest.mark.parametrize(
    "text",
    [
        CALL.replace("get_weather", "get_news"),  # a function not offered
        CALL.replace('"Paris"', "3"),  # arguments off the schema
        CALL.replace(', "days": 3', ', "hours": 3'),  # a property the schema does not have
        CALL.replace('"city": "Paris"', '"city":"Paris"'),  # not json.dumps' separators
        CALL.replace("\n</tool_call>", "</tool_call>"),
        "Sure. " + CALL,  # text before the call
        '<tool_call>\n{"name": "get_time", "arguments": {"x": 1}}\n</tool_call>',  # it takes none
    ],
)
def test_a_tool_call_grammar_rejects_anything_else(tokenizers, text: str) -> None:
    grammar = tool_call_grammar({"get_weather": WEATHER, "get_time": {}}, parallel=False)
    assert not _accepts(tokenizers, grammar, text)


def test_parallel_calls_follow_each_other_on_new_lines(tokenizers) -> None:
    one = tool_call_grammar({"get_weather": WEATHER}, parallel=False)
    many = tool_call_grammar({"get_weather": WEATHER}, parallel=True)
    assert _accepts(tokenizers, many, CALL) and _accepts(tokenizers, many, CALL + "\n" + CALL)
    assert not _accepts(tokenizers, one, CALL + "\n" + CALL)
    after_one, _ = _matcher(tokenizers, many, CALL)
    assert not after_one.is_stopped()  # another call may follow, or the end
    assert set(END_IDS) < _allowed(after_one)


def test_a_tool_call_grammar_needs_a_function() -> None:
    with pytest.raises(ValueError, match="at least one function"):
        tool_call_grammar({}, parallel=True)


def test_json_object_and_json_schema(tokenizers) -> None:
    assert _accepts(tokenizers, json_object_grammar(), '{"a": [1, 2], "b": {"c": null}}')
    assert not _accepts(tokenizers, json_object_grammar(), "[1, 2]")
    schema = json_schema_grammar(WEATHER)
    assert json.loads(schema.source) == WEATHER
    assert _accepts(tokenizers, schema, '{"city": "Oslo", "days": 2}')
    assert not _accepts(tokenizers, schema, '{"days": 2}')  # city is required
    assert not _accepts(tokenizers, schema, '{"city": "Oslo",\n"days": 2}')


@pytest.mark.parametrize(
    ("grammar", "message"),
    [
        (Grammar("json_schema", '{"type": "foo"}'), "Invalid type: foo"),
        (Grammar("json_schema", '{"type": '), "not valid JSON"),
        (Grammar("json_schema", "[1]"), "must be a JSON object"),
        (Grammar("json_schema", '{"$ref": "#/$defs/nowhere"}'), "does not exist"),
        (Grammar("regex", "a(b"), "unclosed group"),
        (Grammar("lark", "start: <no_such_token>"), "unknown special token"),
    ],
)
def test_grammar_error_says_why_a_grammar_cannot_be_used(tokenizers, grammar, message) -> None:
    error = grammar_error(grammar, tokenizers[1])
    assert error is not None and message in error
    assert "\n" not in error


def test_grammar_error_is_none_for_a_usable_grammar(tokenizers) -> None:
    assert grammar_error(tool_call_grammar({"get_weather": WEATHER}, parallel=True), tokenizers[1]) is None
    assert grammar_error(json_schema_grammar(WEATHER)) is None
