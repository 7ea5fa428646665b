"""Bounds on the JSON a client sends (request bodies, realtime events), checked so that a body at the
size limit costs other clients nothing.

Parsing JSON costs time in proportion to its values, not its bytes: 24 MB of one base64 string
parses in milliseconds, 24 MB of `[]` in seconds, holding the interpreter all along (the parser
never lets other threads run), so parsing off the event loop would not spare it. The values are
therefore bounded before parsing by counting the characters that open or separate them (`[`, `{`,
`,`) with one byte scan; those inside strings count too, which only makes the bound stricter for
text full of commas. Nesting is bounded after parsing, by a walk that needs no recursion.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class JsonBounds:
    """At most `max_elements` values (counted as above) and `max_depth` levels of nesting."""

    max_elements: int
    max_depth: int

    def size_error(self, text: str | bytes | bytearray) -> str | None:
        """Why `text` holds too many values to be parsed, or None; before parsing, in one scan."""
        if isinstance(text, str):
            count = text.count(",") + text.count("[") + text.count("{")
        else:
            count = text.count(b",") + text.count(b"[") + text.count(b"{")
        if count > self.max_elements:
            return (
                f"the JSON holds about {count} values (counted by their '[', '{{' and ','); "
                f"the limit is {self.max_elements}"
            )
        return None

    def depth_error(self, data: Any) -> str | None:
        """Why parsed `data` nests too deeply, or None."""
        todo: list[tuple[Any, int]] = [(data, 1)]
        while todo:
            value, depth = todo.pop()
            if isinstance(value, dict):
                children: Any = value.values()
            elif isinstance(value, list):
                children = value
            else:
                continue
            if depth > self.max_depth:
                return f"the JSON nests deeper than {self.max_depth} levels"
            todo.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
        return None
