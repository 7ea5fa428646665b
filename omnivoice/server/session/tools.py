"""Function calling settings of a realtime session: `tools` and `tool_choice`, in `session.update` and
as a response's own in `response.create` (the GA shapes; the beta protocol has the same).

`tools` is a list of `{type: "function", name, description?, parameters?}` (a JSON schema of the
arguments object); `tool_choice` is "auto" (the model may answer or call), "none" (no function is
offered: the tools are left out of the prompt), "required" (it must call one) or `{type: "function",
name}` (it must call that one). The last two are enforced while decoding. A `tools` list replaces the
one before; a choice that cannot be served (a function not in the list, "required" without tools) is
refused, naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from omnivoice.types import FunctionSpec, Tools

# OpenAI's rule for function names
FUNCTION_NAME = r"^[A-Za-z0-9_-]{1,64}$"


def object_schema(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """`schema` if it may describe a function's arguments (an object); ValueError otherwise."""
    if schema is not None and schema.get("type", "object") != "object":
        raise ValueError('must be the JSON schema of an object ("type": "object")')
    return schema


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FunctionToolParam(_Strict):
    type: Literal["function"] = "function"
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None

    _object_schema = field_validator("parameters")(object_schema)

    def wire(self) -> dict[str, Any]:
        return self.model_dump()


class NamedChoiceParam(_Strict):
    type: Literal["function"]
    name: str


ToolChoiceParam = Literal["auto", "none", "required"] | NamedChoiceParam


class ToolsError(ValueError):
    """Tools or a choice that cannot be served; `param` names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class SessionTools:
    """The functions offered and how the model must use them: `choice` auto | none | required, with
    `function` set when one is named (choice "required")."""

    functions: tuple[FunctionToolParam, ...] = ()
    choice: Literal["auto", "none", "required"] = "auto"
    function: str | None = None

    @property
    def offered(self) -> tuple[FunctionToolParam, ...]:
        """The functions the prompt offers: none with tool_choice "none"."""
        return () if self.choice == "none" else self.functions

    def for_engine(self) -> Tools | None:
        """What the engine is asked to offer the model; None with no function offered. Calls may
        come several in one response (the session API has no parallel_tool_calls)."""
        if not self.offered:
            return None
        functions = tuple(FunctionSpec(f.name, f.description, f.parameters) for f in self.offered)
        choice: Literal["auto", "required"] = "required" if self.choice == "required" else "auto"
        return Tools(functions, choice, self.function)

    def wire_tools(self) -> list[dict[str, Any]]:
        return [f.wire() for f in self.functions]

    def wire_choice(self) -> str | dict[str, Any]:
        return {"type": "function", "name": self.function} if self.function else self.choice


def resolve_tools(
    current: SessionTools,
    tools: list[FunctionToolParam] | None,
    choice: ToolChoiceParam | None,
    where: str,
) -> SessionTools:
    """`current` with `tools` and `choice` set (None keeps each); ToolsError naming `where`.tools or
    `where`.tool_choice when they cannot be served together."""
    functions = current.functions if tools is None else tuple(tools)
    names = [f.name for f in functions]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ToolsError(f"a second function named {name!r}", f"{where}.tools.{i}.name")
    if choice is None:
        kind, function = current.choice, current.function
    elif isinstance(choice, NamedChoiceParam):
        kind, function = "required", choice.name
    else:
        kind, function = choice, None
    if function is not None and function not in names:
        message = f"tool_choice names {function!r}, which is not among the tools"
        raise ToolsError(message, f"{where}.tool_choice.name")
    if kind == "required" and not names:
        raise ToolsError("tool_choice 'required' needs tools", f"{where}.tool_choice")
    return SessionTools(functions, kind, function)
