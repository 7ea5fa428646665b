"""Function calling in `/v1/chat/completions`: the request's `tools`, `tool_choice` and
`parallel_tool_calls`, and the tool turns of its history (assistant `tool_calls`, `tool` messages).

`tool_choice` "auto" (the default with tools) lets the model answer or call; "required" makes it call
at least one function, a named function (`{"type": "function", "function": {"name": ...}}`) that one;
both are enforced while decoding. "none" offers the model no function: the tools are left out of its
prompt, and its text is all answer. `parallel_tool_calls: false` keeps at most one call per response.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, field_validator

from omnivoice.server.chat.content import Lenient
from omnivoice.server.errors import APIError, bad_request
from omnivoice.server.session.tools import FUNCTION_NAME, object_schema
from omnivoice.types import FunctionSpec, Tools


class FunctionDef(Lenient):
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments object
    strict: bool | None = None

    _object_schema = field_validator("parameters")(object_schema)


class ToolDef(Lenient):
    type: Literal["function"]
    function: FunctionDef


class ChosenFunction(Lenient):
    name: str


class NamedToolChoice(Lenient):
    type: Literal["function"]
    function: ChosenFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice
CHOICES = ("none", "auto", "required")


def tool_choice_shape(v: Any) -> Any:
    """Refuse a `tool_choice` of neither form with one clear message (before pydantic's union errors)."""
    if v is None or v in CHOICES or isinstance(v, dict):
        return v
    raise ValueError(
        f'must be one of {CHOICES} or {{"type": "function", "function": {{"name": ...}}}}, not {v!r}'
    )


class FunctionCall(Lenient):
    name: str
    arguments: str

    @field_validator("arguments")
    @classmethod
    def _json(cls, v: str) -> str:
        try:
            json.loads(v)
        except ValueError:
            raise ValueError("must be the JSON text of the arguments") from None
        return v


class ToolCallIn(Lenient):
    """A call in an assistant message of the history."""

    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionCall


def check_tools(tools: list[ToolDef] | None, choice: ToolChoice | None) -> None:
    """Refuse tools that cannot be offered as asked (400, naming the field)."""
    names = [t.function.name for t in tools or ()]
    for i, name in enumerate(names):
        if name in names[:i]:
            message = f"tools[{i}]: a second function named {name!r}"
            raise bad_request(message, param=f"tools[{i}].function.name")
    if choice in (None, "none", "auto"):
        return
    if not names:
        raise bad_request("tool_choice asks for a function call, but no tools are given", param="tool_choice")
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        message = f"tool_choice names {choice.function.name!r}, which is not among the tools"
        raise bad_request(message, param="tool_choice.function.name")


def offered_tools(
    tools: list[ToolDef] | None, choice: ToolChoice | None, parallel: bool | None
) -> Tools | None:
    """What the engine is asked to offer the model (None: no function, as with tool_choice none)."""
    if not tools or choice == "none":
        return None
    functions = tuple(
        FunctionSpec(t.function.name, t.function.description, t.function.parameters) for t in tools
    )
    named = choice.function.name if isinstance(choice, NamedToolChoice) else None
    required: Literal["auto", "required"] = "required" if named or choice == "required" else "auto"
    return Tools(functions, required, named, parallel is not False)


def tool_texts(tools: Tools | None, calls: list[ToolCallIn]) -> list[str]:
    """Text the prompt holds for the offered functions and the history's calls (for size checks)."""
    texts = [c.function.name + c.function.arguments for c in calls]
    for f in tools.functions if tools else ():
        texts.append(f.name + (f.description or "") + json.dumps(f.parameters or {}, ensure_ascii=False))
    return texts


def tool_turn_error(where: str, message: str, field: str = "") -> APIError:
    return bad_request(f"{where}: {message}", param=f"{where}{field}")


def check_tool_turn(where: str, tool_call_id: str | None, call_ids: set[str]) -> None:
    """A tool message must answer a call an earlier assistant message made."""
    if tool_call_id is None:
        raise tool_turn_error(where, "a tool message needs the tool_call_id it answers", ".tool_call_id")
    if tool_call_id not in call_ids:
        message = f"tool_call_id {tool_call_id!r} answers no tool call of an earlier assistant message"
        raise tool_turn_error(where, message, ".tool_call_id")
