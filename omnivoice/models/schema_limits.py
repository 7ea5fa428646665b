"""Cheap checks of a JSON schema before llguidance compiles it: what it could only compile at a cost
out of proportion to the request (a regular expression of a million repeated items), or not at all
into a grammar that lets the model finish (a required `$ref` cycle: no finite value matches).

These run on the schema's text alone, in time linear in its size; what they pass may still be too
costly, which the bounded compile of `engine.grammar_vetting` catches.
"""

from __future__ import annotations

import re
import re._parser as _sre  # type: ignore[import-not-found]
from collections.abc import Iterator, Mapping
from typing import Any

MAX_REPEAT = 10_000  # items a pattern's nested repetition bounds may multiply to
MAX_LENGTH_BOUND = 100_000  # minLength/maxLength/minItems/maxItems larger than this are refused
_POSSESSIVE = getattr(_sre, "POSSESSIVE_REPEAT", None)


def schema_limit_error(schema: Any) -> str | None:
    """Why `schema` is refused before compiling, or None."""
    for node in _nodes(schema):
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            error = pattern_limit_error(pattern)
            if error is not None:
                return error
        for key in ("minLength", "maxLength", "minItems", "maxItems"):
            value = node.get(key)
            if isinstance(value, int) and value > MAX_LENGTH_BOUND:
                return f"{key} {value} is over this server's limit of {MAX_LENGTH_BOUND}"
    if isinstance(schema, Mapping) and not _finite(schema):
        return "the schema admits no finite value (a required $ref cycle without a way out)"
    return None


def pattern_limit_error(pattern: str) -> str | None:
    """Why a regular expression is too costly to compile (its nested repetitions multiply to more
    than MAX_REPEAT items), or None. A pattern Python's parser does not read is left to the compile."""
    try:
        tree = _sre.parse(pattern)
    except (re.error, RecursionError, OverflowError, ValueError):
        return None
    worst = _repeats(tree)
    if worst > MAX_REPEAT:
        return (
            f"the pattern {pattern[:80]!r} repeats up to {worst} items; this server's limit is {MAX_REPEAT}"
        )
    return None


def _repeats(tree: Any) -> int:
    """The largest product of nested repetition bounds in a parsed pattern (an unbounded repetition
    counts its lower bound: it is a loop, not copies)."""
    worst = 1
    for op, arg in tree:
        if op in (_sre.MAX_REPEAT, _sre.MIN_REPEAT, _POSSESSIVE):
            low, high, sub = arg
            bound = low if high == _sre.MAXREPEAT else high
            worst = max(worst, max(1, bound) * _repeats(sub))
        elif op == _sre.SUBPATTERN:
            worst = max(worst, _repeats(arg[-1]))
        elif op == _sre.BRANCH:
            worst = max([worst, *(_repeats(b) for b in arg[1])])
        elif op in (_sre.ASSERT, _sre.ASSERT_NOT):
            worst = max(worst, _repeats(arg[1]))
    return worst


def _nodes(schema: Any) -> Iterator[Mapping[str, Any]]:
    """Every object in the schema (iteratively: a deep schema does not exhaust the stack)."""
    todo = [schema]
    while todo:
        node = todo.pop()
        if isinstance(node, Mapping):
            yield node
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)


def _finite(root: Mapping[str, Any]) -> bool:
    """Whether some finite JSON value matches `root` (its local `$ref`s resolved in it): the least
    fixed point of "finite", grown until nothing changes, in passes over the schema's objects."""
    nodes = list(_nodes(root))
    finite: set[int] = set()

    def ok(node: Any) -> bool:
        return node is not False and (not isinstance(node, Mapping) or id(node) in finite)

    def grows(node: Mapping[str, Any]) -> bool:
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            target = _resolve(root, ref)
            if target is not None and not ok(target):
                return False
        for key in ("anyOf", "oneOf"):
            if isinstance(node.get(key), list) and node[key] and not any(ok(n) for n in node[key]):
                return False
        if isinstance(node.get("allOf"), list) and not all(ok(n) for n in node["allOf"]):
            return False
        properties, required = node.get("properties"), node.get("required")
        if isinstance(properties, Mapping) and isinstance(required, list):
            named = [properties[k] for k in required if isinstance(k, str) and k in properties]
            if not all(ok(n) for n in named):
                return False
        min_items, items = node.get("minItems", 0), node.get("items")
        return not (isinstance(min_items, int) and min_items > 0 and items is not None and not ok(items))

    changed = True
    while changed:
        changed = False
        for node in nodes:
            if id(node) not in finite and grows(node):
                finite.add(id(node))
                changed = True
    return id(root) in finite


def _resolve(root: Mapping[str, Any], ref: str) -> Any:
    """The object a local `$ref` ("#", "#/$defs/name") names in `root`, or None."""
    node: Any = root
    for key in [k for k in ref[1:].split("/") if k]:
        key = key.replace("~1", "/").replace("~0", "~")
        node = node.get(key) if isinstance(node, Mapping) else None
    return node
