"""Grammars that hold the thinker's answer to a form, and their compiled text for llguidance.

The builders return a `Grammar` (the shared vocabulary's, independent of any tokenizer): a tool call in
the Hermes form Qwen3's chat template teaches, any JSON object, or JSON of a schema. JSON is written
as `json.dumps` writes it (", " between items, ": " after keys, no other whitespace), the form the
chat template renders arguments in, so a model is never free to pad it with whitespace forever.

`compile_grammar` turns a `Grammar` into llguidance's grammar text and `grammar_error` says why one
cannot be used (None when it can); `grammar_tokenizer` is llguidance's view of a served tokenizer,
built once per runner, and `matcher_for` the matcher that follows one request's grammar.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from llguidance import LLMatcher, LLTokenizer
from llguidance.hf import from_tokenizer

from omnivoice.types import Grammar

# llguidance's JSON options for every schema compiled here: json.dumps' separators, nothing else
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
TOOL_CALL_START = "<tool_call>"  # special tokens of the Qwen3 vocabulary, matched as single tokens
TOOL_CALL_END = "</tool_call>"
# the arguments of a function declared without parameters: an empty parameter list
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}
_LISTING = re.compile(r"^(\d+ \|.*|\^)$")  # a line of the compiled grammar, or a caret under one
_POSITION = re.compile(r"^at \d+\(\d+\): ")


def json_object_grammar() -> Grammar:
    """Any JSON object (`response_format: {"type": "json_object"}`)."""
    return json_schema_grammar({"type": "object"})


def json_schema_grammar(schema: Mapping[str, Any]) -> Grammar:
    """JSON valid against `schema` (`response_format: {"type": "json_schema", ...}`)."""
    return Grammar("json_schema", json.dumps(schema, ensure_ascii=False))


def tool_call_grammar(parameters_by_name: Mapping[str, Mapping[str, Any]], parallel: bool) -> Grammar:
    """Tool calls of the functions named (keys), each as Qwen3's chat template writes one:

        <tool_call>
        {"name": "<name>", "arguments": <JSON of that function's parameters schema>}
        </tool_call>

    `<tool_call>` and `</tool_call>` are the vocabulary's special tokens. One call, or with `parallel`
    one or more separated by a newline (as the template joins them). An empty schema is a function
    without parameters: its arguments are `{}`.
    """
    if not parameters_by_name:
        raise ValueError("a tool call grammar needs at least one function")
    rules = [
        "start: call" + (' ("\\n" call)*' if parallel else ""),
        f'call: {TOOL_CALL_START} "\\n" body "\\n" {TOOL_CALL_END}',
        "body: " + " | ".join(f"fn{i}" for i in range(len(parameters_by_name))),
    ]
    for i, (name, schema) in enumerate(parameters_by_name.items()):
        head = '{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": '
        rules.append(f'fn{i}: {json.dumps(head, ensure_ascii=False)} args{i} "}}"')
        rules.append(f"args{i}: %json {_styled(schema or NO_PARAMETERS)}")
    return Grammar("lark", "\n".join(rules) + "\n")


def compile_grammar(grammar: Grammar) -> str:
    """llguidance's grammar text for `grammar`; ValueError when its source is malformed (a JSON schema
    that is not a JSON object). Whether it compiles is `grammar_error`'s question."""
    if grammar.kind == "lark":
        return LLMatcher.grammar_from_lark(grammar.source)
    if grammar.kind == "regex":
        return LLMatcher.grammar_from_regex(grammar.source)
    try:
        schema = json.loads(grammar.source)
    except json.JSONDecodeError as e:
        raise ValueError(f"the JSON schema is not valid JSON: {e}") from None
    if not isinstance(schema, dict):
        raise ValueError("a JSON schema must be a JSON object")
    # llguidance types `defaults` as a TypedDict that exists only in its stubs
    return LLMatcher.grammar_from_json_schema(schema, defaults=JSON_STYLE)  # type: ignore[arg-type]


def grammar_error(grammar: Grammar, tokenizer: LLTokenizer | None = None) -> str | None:
    """Why `grammar` cannot constrain decoding (llguidance's message on one line), or None. Without a
    `tokenizer` the special tokens it names are not checked."""
    try:
        text = compile_grammar(grammar)
    except ValueError as e:
        return str(e)
    message = LLMatcher.validate_grammar(text, tokenizer)
    return _one_line(message) if message else None


def matcher_for(grammar: Grammar, tokenizer: LLTokenizer) -> LLMatcher:
    """A matcher that follows `grammar` token by token; ValueError (saying why, on one line) when the
    grammar cannot be used."""
    matcher = LLMatcher(tokenizer, compile_grammar(grammar), log_level=0)
    if matcher.is_error():
        raise ValueError(_one_line(matcher.get_error()))
    return matcher


def matcher_error(matcher: LLMatcher) -> str:
    """Why `matcher` stopped on an error, on one line (without llguidance's dump of its state)."""
    return matcher.get_error().split("<state>")[0].strip().splitlines()[0]


def grammar_tokenizer(hf_tokenizer: Any, vocab_size: int, end_ids: Sequence[int]) -> LLTokenizer:
    """llguidance's view of a (fast) Hugging Face tokenizer, for a model whose logits have
    `vocab_size` entries (ids past the tokenizer's are never allowed). A finished grammar allows only
    `end_ids`, so the answer ends the way the model ends it. Costly for a full vocabulary: build it
    once."""
    return from_tokenizer(hf_tokenizer, n_vocab=vocab_size, eos_token=list(end_ids))


def _one_line(message: str) -> str:
    """llguidance's message without its listing of the grammar (the text it compiled, not the one the
    client sent) and without positions in that text."""
    lines = [line.strip() for line in message.splitlines()]
    kept = [line for line in lines if line and not _LISTING.match(line)]
    return _POSITION.sub("", " ".join(kept))


def _styled(schema: Mapping[str, Any]) -> str:
    """`schema` as JSON for `%json`, carrying JSON_STYLE (lark-embedded schemas take no defaults)."""
    return json.dumps({**schema, "x-guidance": JSON_STYLE}, ensure_ascii=False)
