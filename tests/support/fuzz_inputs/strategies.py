"""Hypothesis strategies shared by the fuzz tests: arbitrary JSON, mutations of valid messages, raw
garbage, base64 that lies, and the edge values parsers get wrong (huge, negative, NaN, lone surrogates).
"""

from __future__ import annotations

import base64
import json
from typing import Any

from hypothesis import strategies as st

EDGE_INTS = [0, -1, 1, 2**31, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30, -(10**30)]
EDGE_FLOATS = [0.0, -0.0, -1.5, 0.5, 1e308, -1e308, 1e-320, float("nan"), float("inf"), float("-inf")]
EDGE_STRINGS = [
    "",
    " ",
    "\x00",
    "\ud800",  # a lone surrogate: valid in JSON (\ud800) and in a Python str, not encodable as UTF-8
    "é🎤",
    "null",
    "inf",
    "realtime",
    "audio",
    "text",
    "pcm16",
    "g711_ulaw",
    "audio/pcm",
    "wav",
    "user",
    "assistant",
    "system",
    "message",
    "ethan",
    "alloy",
]

long_strings = st.sampled_from([1_000, 100_000]).map(lambda n: "word " * n)  # long, and many tokens
scalars = st.one_of(
    long_strings,
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from(EDGE_INTS),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(EDGE_FLOATS),
    st.text(max_size=20),
    st.sampled_from(EDGE_STRINGS),
)

# Any JSON value Python's json module reads (NaN and Infinity included: json.loads accepts them).
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=8,
)


@st.composite
def mutated(draw: st.DrawFn, base: Any, depth: int = 0) -> Any:
    """`base` (a valid message) with some of its parts dropped, replaced by garbage, or added to;
    biased towards keeping most of it, so the mutation reaches deep validation. The top level stays
    an object (raw garbage has strategies of its own)."""
    if depth == 0:
        action = "recurse"
    else:
        action = draw(st.sampled_from(["keep", "keep", "keep", "recurse", "recurse", "garbage", "wrap"]))
    if action == "garbage":
        return draw(json_values)
    if action == "wrap":
        return draw(st.sampled_from([[base], {"value": base}, json.dumps(base)]))
    if isinstance(base, dict):
        out: dict[str, Any] = {}
        for key, value in base.items():
            fates = ["keep"] * (8 if key in ("type", "event") else 3) + ["mutate", "mutate", "drop"]
            fate = draw(st.sampled_from(fates))  # the tag mostly kept: the body is what is checked
            if fate == "keep" or (fate == "mutate" and depth > 4):
                out[key] = value
            elif fate == "mutate":
                out[key] = draw(mutated(value, depth + 1))
        for key in draw(st.lists(st.sampled_from(["extra", "x" * 40, "__proto__"]) | st.text(), max_size=2)):
            out.setdefault(key, draw(json_values))
        return out
    if isinstance(base, list):
        out_list = [draw(mutated(v, depth + 1)) if draw(st.booleans()) else v for v in base]
        if draw(st.booleans()):
            out_list += draw(st.lists(json_values, max_size=3))
        return out_list
    if action == "recurse":  # a scalar: an edge value of the same kind, or of another
        return draw(st.sampled_from([*EDGE_INTS, *EDGE_FLOATS, *EDGE_STRINGS, None, True]) | long_strings)
    return base


def pick(*choices: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """One of `choices`, each equally likely (`one_of` flattens nested unions, which would weight
    a union of many raw strategies above a single structured one); list one twice to favour it."""
    return st.sampled_from(choices).flatmap(lambda s: s)


# ---- raw text and bytes ----------------------------------------------------------------------------
JSON_FRAGMENTS = ["{", "}", "[", "]", '"', ":", ",", "null", "true", "1e999", "NaN", "-", "\\u", "\\ud800"]

raw_text = st.one_of(
    st.text(max_size=200),
    st.lists(st.sampled_from(JSON_FRAGMENTS) | st.text(max_size=3), max_size=40).map("".join),
    st.integers(1, 200_000).map(lambda n: "[" * n),  # deeper than json's recursion limit
    st.integers(1, 50_000).map(lambda n: '{"a":' * n),
    json_values.map(json.dumps),
)
raw_bytes = st.one_of(st.binary(max_size=300), raw_text.map(lambda s: s.encode("utf-8", "surrogatepass")))


# ---- base64 ----------------------------------------------------------------------------------------
def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@st.composite
def lying_base64(draw: st.DrawFn, payloads: st.SearchStrategy[bytes] | None = None) -> str:
    """Base64 of `payloads` (any bytes by default), often broken: bad characters, bad padding,
    url-safe, line-wrapped, a data URL, non-ASCII, or huge."""
    text = b64(draw(payloads if payloads is not None else st.binary(max_size=2000)))
    how = draw(
        st.sampled_from(
            ["plain", "plain", "strip_pad", "extra_pad", "bad_char", "urlsafe", "wrapped", "data_url",
             "non_ascii", "truncate", "huge", "empty", "text"]
        )
    )  # fmt: skip
    if how == "strip_pad":
        return text.rstrip("=")
    if how == "extra_pad":
        return text + "=" * draw(st.integers(1, 5))
    if how == "bad_char":
        at = draw(st.integers(0, len(text)))
        return text[:at] + draw(st.sampled_from(["!", "*", " ", "\n", "=", "\x00", "é"])) + text[at:]
    if how == "urlsafe":
        return text.replace("+", "-").replace("/", "_")
    if how == "wrapped":
        return "\n".join(text[i : i + 76] for i in range(0, len(text), 76))
    if how == "data_url":
        return draw(st.sampled_from(["data:audio/wav;base64,", "data:", "data:text/plain,"])) + text
    if how == "non_ascii":
        return text + draw(st.sampled_from(["é", "\ud800", "🎤", "\uff21"]))
    if how == "truncate":
        return text[: draw(st.integers(0, len(text)))]
    if how == "huge":  # cheap to build, expensive to decode
        return draw(st.sampled_from(["AAAA", "////", "UklG"])) * draw(st.sampled_from([2**18, 2**21, 2**22]))
    if how == "empty":
        return ""
    if how == "text":
        return draw(st.text(max_size=50))
    return text
