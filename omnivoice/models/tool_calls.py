"""The function calls in a response's text, parsed as the text streams in (Hermes form, as Qwen3's chat
template asks for them):

    Let me look that up.<tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

`ToolCallParser` is fed the response's text deltas however they are cut (a tag split across deltas
included) and returns, in text order, the text that is said (`str`) and the calls: a call's first
`ToolCallDelta` (its id and name) as soon as its name is complete, its arguments' JSON text in pieces
as they arrive, then `ToolCallDone`. Whitespace that only separates calls from each other or from the
text is dropped. A call written otherwise than `{"name": ..., "arguments": ...}` (keys in another
order, extra keys) is read whole at its closing tag; one that is no such JSON object is not a call:
its text goes out as said text. A call cut short (the response ended inside it), or whose arguments
are not one complete JSON value, ends with `ToolCallDone.error` saying so.

`call_grammar` is what holds the thinker to a call when the request requires one.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from omnivoice.models.grammars import tool_call_grammar
from omnivoice.types import Grammar, ToolCall, ToolCallDelta, ToolCallDone, Tools

OPEN, CLOSE = "<tool_call>", "</tool_call>"
ParsedOutput = str | ToolCallDelta | ToolCallDone


def call_grammar(tools: Tools) -> Grammar | None:
    """The grammar that makes the thinker call a function when `tools` require it: any of them
    ("required"; several calls if parallel) or the one named (one call of it). None: "auto"."""
    if tools.choice != "required":
        return None
    chosen = [f for f in tools.functions if tools.function in (None, f.name)]
    if not chosen:
        raise ValueError(f"no function named {tools.function!r} is offered")
    parameters = {f.name: dict(f.parameters or {}) for f in chosen}
    return tool_call_grammar(parameters, tools.parallel and tools.function is None)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _held(text: str, tag: str) -> int:
    """How many characters at the end of `text` could begin `tag` (kept until the next delta)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def _json_string_end(s: str, start: int) -> int | None:
    """Index just past the JSON string opening at s[start] ('"'), or None if it is not closed yet."""
    i = start + 1
    while i < len(s):
        if s[i] == "\\":
            i += 2
        elif s[i] == '"':
            return i + 1
        else:
            i += 1
    return None


_PARTIAL = "partial"


def match_head(body: str) -> tuple[str, int] | str | None:
    """Match `{"name": "<name>", "arguments":` at the start of a call's body (whitespace allowed
    between tokens): (name, index where the arguments' value starts), `_PARTIAL` while the body is
    a prefix of such a head, None once it cannot be one."""
    pos, name = 0, ""
    for expected in ("{", '"name"', ":", "", ",", '"arguments"', ":", None):
        while pos < len(body) and body[pos].isspace():
            pos += 1
        if pos == len(body):
            return _PARTIAL
        if expected is None:
            return name, pos
        if expected == "":  # the name, a JSON string
            if body[pos] != '"':
                return None
            end = _json_string_end(body, pos)
            if end is None:
                return _PARTIAL
            try:
                name = json.loads(body[pos:end])
            except ValueError:
                return None
            pos = end
        elif body.startswith(expected, pos):
            pos += len(expected)
        elif expected.startswith(body[pos:]):
            return _PARTIAL
        else:
            return None
    raise AssertionError("unreachable")


@dataclass
class _ValueScanner:
    """Finds where one JSON value ends in text fed piece by piece (strings and nesting respected)."""

    depth: int = 0
    in_string: bool = False
    escaped: bool = False
    started: bool = False
    scalar: bool = False
    done: bool = False

    def take(self, text: str) -> int:
        """Consume `text`; the number of its characters that belong to the value (all until done)."""
        for i, ch in enumerate(text):
            if self._step(ch):
                self.done = True
                return i + (0 if self.scalar else 1)
        return len(text)

    def _step(self, ch: str) -> bool:
        """Advance over `ch`; True when the value ends with it (a scalar ends before it)."""
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif ch == "\\":
                self.escaped = True
            elif ch == '"':
                self.in_string = False
                return self.depth == 0
            return False
        if not self.started:
            self.started = True
            self.scalar = ch not in '{["'
            self.in_string = ch == '"'
            self.depth = 1 if ch in "{[" else 0
            return False
        if self.scalar:
            return ch.isspace() or ch in ",}]"
        if ch == '"':
            self.in_string = True
        elif ch in "{[":
            self.depth += 1
        elif ch in "}]":
            self.depth -= 1
            return self.depth == 0
        return False


@dataclass
class _Call:
    index: int
    call_id: str
    body: str = ""  # everything after <tool_call> so far
    seen: int = 0  # characters of `body` already looked at
    name: str | None = None  # known once the head matched; None while buffering (or read whole)
    whole: bool = False  # the head cannot match: read the body whole at the closing tag
    arguments: list[str] = field(default_factory=list)
    value: _ValueScanner = field(default_factory=_ValueScanner)
    rest: str = ""  # what follows the arguments' value


class ToolCallParser:
    """Splits one response's text into what is said and the function calls it writes (see the module
    docstring). `feed` each text delta, then `finish` once the response ends."""

    def __init__(self, request_id: str, new_id: Callable[[], str] = new_call_id) -> None:
        self._rid = request_id
        self._new_id = new_id
        self._text = ""  # said text not yet given out: a possible tag start, or whitespace
        self._call: _Call | None = None
        self._calls = 0
        self._after_call = False  # whitespace that follows a call is dropped

    def feed(self, text: str) -> list[ParsedOutput]:
        out: list[ParsedOutput] = []
        while text:
            text = self._feed_call(text, out) if self._call else self._feed_text(text, out)
        return out

    def finish(self) -> list[ParsedOutput]:
        """The end of the response: a call still open ends here, held text goes out."""
        out: list[ParsedOutput] = []
        call = self._call
        if call is not None:
            self._call = None
            if call.name is None:  # never a call: what was written is said text
                self._say(OPEN + call.body, out)
            else:
                self._scan(call, len(call.body), out)
                out.append(self._done(call, "the response ended inside the call"))
        if self._text.strip() or (self._text and not self._calls):  # whitespace by a call is dropped
            out.append(self._text)
        self._text = ""
        return out

    # ---- said text -------------------------------------------------------------------------------
    def _feed_text(self, text: str, out: list[ParsedOutput]) -> str:
        buffer = self._text + text
        if self._after_call:
            buffer = buffer.lstrip()
        at = buffer.find(OPEN)
        if at >= 0:
            self._say(buffer[:at].rstrip(), out)  # whitespace just before a call is dropped
            self._text, self._after_call = "", False
            self._call = _Call(self._calls, self._new_id())
            self._calls += 1
            return buffer[at + len(OPEN) :]
        keep = _held(buffer, OPEN)
        ready, tail = buffer[: len(buffer) - keep], buffer[len(buffer) - keep :]
        said = ready.rstrip()  # trailing whitespace waits: a call may follow it
        if said:
            out.append(said)
            self._after_call = False
        self._text = ready[len(said) :] + tail
        return ""

    def _say(self, text: str, out: list[ParsedOutput]) -> None:
        if text.strip():
            out.append(text)

    # ---- a call ----------------------------------------------------------------------------------
    def _feed_call(self, text: str, out: list[ParsedOutput]) -> str:
        call = self._call
        assert call is not None
        call.body += text
        at = call.body.find(CLOSE)
        if at < 0:
            self._scan(call, len(call.body) - _held(call.body, CLOSE), out)
            return ""
        after = call.body[at + len(CLOSE) :]
        call.body = call.body[:at]
        self._scan(call, at, out)
        self._call = None
        self._after_call = True
        if call.whole or call.name is None:
            self._close_whole(call, out)
        elif call.value.done and call.rest.strip() == "}":
            out.append(self._done(call, None))
        else:
            out.append(self._done(call, "the arguments are not one JSON value closing the call"))
        return after

    def _scan(self, call: _Call, upto: int, out: list[ParsedOutput]) -> None:
        """Look at body[:upto]: match the head, then stream the arguments' text."""
        if call.whole:
            return
        if call.name is None:
            head = match_head(call.body[:upto])
            if head is None:
                call.whole = True
                return
            if isinstance(head, str):  # _PARTIAL: wait for more of the body
                return
            call.name, call.seen = head
            out.append(ToolCallDelta(self._rid, call.index, call.call_id, call.name, ""))
        new = call.body[call.seen : upto]
        call.seen = max(call.seen, upto)
        if call.value.done:
            call.rest += new
            return
        n = call.value.take(new)
        if n:
            call.arguments.append(new[:n])
            out.append(ToolCallDelta(self._rid, call.index, call.call_id, None, new[:n]))
        call.rest += new[n:]

    def _close_whole(self, call: _Call, out: list[ParsedOutput]) -> None:
        """A call read at its closing tag; said text if it is no `{"name", "arguments"}` object."""
        try:
            parsed = json.loads(call.body)
        except ValueError:
            parsed = None
        name = parsed.get("name") if isinstance(parsed, dict) else None
        if not isinstance(name, str) or "arguments" not in parsed:
            self._calls -= 1
            self._say(OPEN + call.body + CLOSE, out)
            return
        args = parsed["arguments"]
        text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        call.name, call.arguments = name, [text]
        out.append(ToolCallDelta(self._rid, call.index, call.call_id, name, ""))
        out.append(ToolCallDelta(self._rid, call.index, call.call_id, None, text))
        out.append(self._done(call, None))

    def _done(self, call: _Call, error: str | None) -> ToolCallDone:
        assert call.name is not None
        call_ = ToolCall(call.call_id, call.name, "".join(call.arguments))
        return ToolCallDone(self._rid, call.index, call_, error)
