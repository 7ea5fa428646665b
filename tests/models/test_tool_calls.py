"""The streaming tool-call parser: said text and calls out of a response's text, however it is cut."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omnivoice.models.tool_calls import ParsedOutput, ToolCallParser
from omnivoice.types import ToolCall, ToolCallDelta, ToolCallDone


@dataclass
class Assembled:
    """What a client rebuilds from the outputs (as OpenAI's streamed deltas are rebuilt)."""

    text: str = ""
    calls: dict[int, list[str]] = field(default_factory=dict)  # index -> [id, name, arguments]
    done: list[ToolCallDone] = field(default_factory=list)
    argument_pieces: int = 0


def assemble(outputs: list[ParsedOutput]) -> Assembled:
    a = Assembled()
    for out in outputs:
        if isinstance(out, str):
            a.text += out
        elif isinstance(out, ToolCallDelta):
            if out.name is not None:
                assert out.index not in a.calls and out.arguments == ""
                a.calls[out.index] = [out.call_id, out.name, ""]
            else:
                assert a.calls[out.index][0] == out.call_id
                a.calls[out.index][2] += out.arguments
                a.argument_pieces += 1
        else:
            assert out.index in a.calls and out.call == ToolCall(*a.calls[out.index])
            a.done.append(out)
    assert sorted(a.calls) == list(range(len(a.calls)))
    return a


def parse(pieces: list[str]) -> Assembled:
    ids = (f"call_{i}" for i in itertools.count())
    parser = ToolCallParser("req", new_id=lambda: next(ids))
    outputs = [out for piece in pieces for out in parser.feed(piece)] + parser.finish()
    return assemble(outputs)


def call_text(name: str, arguments: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


ARGS = {"city": "Paris {x}", "quote": 'say "hi" \\ </tool_call', "days": [1, {"n": 2}], "ok": True}
RESPONSE = "Let me check.\n" + call_text("get_weather", ARGS) + "\n" + call_text("get_time", {}) + "\n"


def test_text_without_calls_passes_through_whole() -> None:
    text = "Hello there, friend.  The <b>weather</b> is < 20 C.\n"
    assert parse([text]) == Assembled(text=text)
    assert parse(list(text)) == Assembled(text=text)


def test_calls_are_split_from_the_text() -> None:
    a = parse([RESPONSE])
    assert a.text == "Let me check."
    assert a.calls == {0: ["call_0", "get_weather", json.dumps(ARGS)], 1: ["call_1", "get_time", "{}"]}
    assert [d.error for d in a.done] == [None, None]
    assert json.loads(a.calls[0][2]) == ARGS


def test_arguments_stream_as_they_arrive() -> None:
    parser = ToolCallParser("req", new_id=lambda: "call_x")
    head = parser.feed('Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city"')
    assert head == [
        "Sure.",
        ToolCallDelta("req", 0, "call_x", "get_weather", ""),
        ToolCallDelta("req", 0, "call_x", None, '{"city"'),
    ]
    assert parser.feed(': "Oslo"}') == [ToolCallDelta("req", 0, "call_x", None, ': "Oslo"}')]
    assert parser.feed("}\n</tool") == []
    assert parser.feed("_call>") == [
        ToolCallDone("req", 0, ToolCall("call_x", "get_weather", '{"city": "Oslo"}'))
    ]
    assert parser.finish() == []


def test_any_cut_of_the_text_gives_the_same_result() -> None:
    whole = parse([RESPONSE])
    one_by_one = parse(list(RESPONSE))
    assert (one_by_one.text, one_by_one.calls) == (whole.text, whole.calls)
    assert one_by_one.argument_pieces > 10  # streamed, not held to the end
    for cut in range(len(RESPONSE) + 1):
        halves = parse([RESPONSE[:cut], RESPONSE[cut:]])
        assert (halves.text, halves.calls) == (whole.text, whole.calls), cut


def test_text_after_calls_is_said_without_the_separating_whitespace() -> None:
    a = parse(["One moment. ", call_text("f", {"a": 1}), "\n\n  It is sunny.", " Bye.\n"])
    assert a.text == "One moment.It is sunny. Bye."
    assert a.calls == {0: ["call_0", "f", '{"a": 1}']}


def test_keys_in_another_order_are_read_whole_at_the_closing_tag() -> None:
    a = parse(list('<tool_call>{"arguments": {"x": [1, 2]}, "name": "f"}</tool_call>'))
    assert a.calls == {0: ["call_0", "f", '{"x": [1, 2]}']} and a.done[0].error is None
    a = parse(['<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>'])
    assert a.calls == {0: ["call_0", "f", '"{\\"x\\": 1}"']}  # a string value, as written


@pytest.mark.parametrize(
    "body",
    ["not json at all", '{"name": "f"}', '{"arguments": {}}', "[1, 2]", '{"name": 3, "arguments": {}}'],
)
def test_a_body_that_is_no_call_is_said_text(body: str) -> None:
    text = f"Hi.<tool_call>{body}</tool_call> Bye."
    a = parse(list(text))
    assert a.calls == {} and a.text == f"Hi.<tool_call>{body}</tool_call>Bye."


def test_a_call_cut_short_ends_with_an_error() -> None:
    a = parse(['<tool_call>\n{"name": "f", "arguments": {"city": "Par'])
    assert a.calls == {0: ["call_0", "f", '{"city": "Par']}
    assert a.done[0].error == "the response ended inside the call"
    a = parse(['<tool_call>\n{"name": "f", "argu'])  # before its name was known: said text
    assert a.calls == {} and a.text == '<tool_call>\n{"name": "f", "argu'


@pytest.mark.parametrize(
    "body",
    [
        '{"name": "f", "arguments": {"a": 1}',
        '{"name": "f", "arguments": {"a": 1}} extra',
        '{"name": "f", "arguments": {"a": 1',
    ],
)
def test_arguments_that_do_not_close_the_call_are_an_error(body: str) -> None:
    a = parse([f"<tool_call>{body}</tool_call>"])
    assert a.calls[0][:2] == ["call_0", "f"] and a.done[0].error is not None


def test_scalar_and_string_arguments_end_where_the_value_ends() -> None:
    assert parse(['<tool_call>{"name": "f", "arguments": 42 }</tool_call>']).calls[0][2] == "42"
    assert parse(['<tool_call>{"name": "f", "arguments": "a}b"}</tool_call>']).calls[0][2] == '"a}b"'


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(
    said=st.text(max_size=20).filter(lambda t: "<tool_call>" not in t and t == t.strip()),
    calls=st.lists(st.tuples(st.text(min_size=1, max_size=8), json_values), max_size=3),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
)
def test_any_well_formed_response_round_trips(said: str, calls, cuts: list[int]) -> None:
    text = said + "".join("\n" + call_text(name, args) for name, args in calls)
    bounds = sorted({0, len(text), *[c for c in cuts if c < len(text)]})
    a = parse([text[i:j] for i, j in itertools.pairwise(bounds)])
    assert a.text == (said if said or not calls else "")
    assert [(c[1], json.loads(c[2])) for c in a.calls.values()] == calls
    assert all(d.error is None for d in a.done)


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.sampled_from(['<tool_call>', '</tool_call>', '{"name": ', '"f"', ', "arguments": ',
                                         "{", "}", '"', "\\", " ", "\n", "x", "<tool", "_call>", "[", "]"]),
                       max_size=30))  # fmt: skip
def test_garbage_never_breaks_the_parser(pieces: list[str]) -> None:
    a = parse(pieces)
    assert len(a.done) == len(a.calls)  # every call started is finished, one way or another
