"""A chat request's ``tools`` / ``tool_choice`` / ``parallel_tool_calls``, checked and typed.

    body.tools, body.tool_choice --tool_plan_from--> ToolPlan (or None: no tools)

Every refusal is a 400 naming the field the client sent (``tools.1.function.name``,
``tool_choice``), before anything is tokenized or compiled. The plan owns nothing
but the client's choices; the grammar (``tool_grammar``) and the parser
(``tool_parser``) read it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from radixlm.runtime.entrypoints.http.errors import INVALID, APIError
from radixlm.runtime.entrypoints.http.openai_protocol import ChatCompletionRequest

__all__ = ["CHOICES", "FunctionTool", "ToolPlan", "tool_plan_from"]

CHOICES = ("none", "auto", "required", "named")
# OpenAI's rule for function names; it also keeps a name literal inside the call's JSON.
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_NO_ARGUMENTS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class FunctionTool:
    """One function the model may call; ``parameters`` is a JSON schema of an object."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] = field(default_factory=lambda: dict(_NO_ARGUMENTS))

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"a function name is 1-64 of [A-Za-z0-9_-], got {self.name!r}")

    def to_openai(self) -> dict[str, Any]:
        """The ``{"type": "function", "function": {...}}`` dict chat templates read."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolPlan:
    """What the request allows.

    Attributes:
        tools: the functions, names unique, in the client's order.
        choice: "none" (never call; output is text), "auto" (text or calls),
            "required" (one call or more), "named" (one call of ``name``).
        name: the function ``named`` forces; None otherwise.
        parallel: whether more than one call may follow (not for "named": one call).
    """

    tools: tuple[FunctionTool, ...]
    choice: str
    name: str | None = None
    parallel: bool = True

    def __post_init__(self) -> None:
        if not self.tools:
            raise ValueError("a tool plan needs at least one tool")
        if self.choice not in CHOICES:
            raise ValueError(f"choice must be one of {CHOICES}, got {self.choice!r}")
        names = [tool.name for tool in self.tools]
        if len(set(names)) != len(names):
            raise ValueError(f"function names repeat: {names}")
        if (self.choice == "named") != (self.name is not None):
            raise ValueError("a name is given exactly when the choice is 'named'")
        if self.name is not None and self.name not in names:
            raise ValueError(f"{self.name!r} is not one of the tools {names}")

    @property
    def calls_allowed(self) -> bool:
        """False for "none": the output is plain text, never parsed for calls."""
        return self.choice != "none"

    @property
    def callable_tools(self) -> tuple[FunctionTool, ...]:
        """The tools a call may name (the named one alone for "named")."""
        if self.choice == "named":
            return tuple(tool for tool in self.tools if tool.name == self.name)
        return self.tools if self.calls_allowed else ()


def tool_plan_from(body: ChatCompletionRequest) -> ToolPlan | None:
    """The request's plan; None when it has no tools (an empty list counts as none).

    Raises:
        APIError (400): tool_choice without tools, a bad or repeated function name, a
            parameters schema that is not a valid JSON Schema of an object, or a
            tool_choice naming no tool; ``param`` names the field.
    """
    if not body.tools:
        if body.tool_choice is not None:
            raise APIError(INVALID, "tool_choice needs tools", "tool_choice")
        return None
    tools = tuple(_function_tool(i, tool.function) for i, tool in enumerate(body.tools))
    _check_unique(tools)
    choice, name = _choice(body.tool_choice, tools)
    parallel = body.parallel_tool_calls is not False and choice != "named"
    return ToolPlan(tools, choice, name, parallel)


def _function_tool(index: int, function: Any) -> FunctionTool:
    where = f"tools.{index}.function"
    if not _NAME.fullmatch(function.name):
        raise APIError(
            INVALID,
            f"{where}.name must be 1-64 letters, digits, '_' or '-', got {function.name!r}",
            f"{where}.name",
        )
    parameters = _NO_ARGUMENTS if function.parameters is None else function.parameters
    _check_parameters(parameters, f"{where}.parameters")
    return FunctionTool(function.name, function.description, parameters)


def _check_parameters(schema: dict[str, Any], param: str) -> None:
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "(root)"
        raise APIError(
            INVALID, f"{param} is not a valid JSON Schema at {where}: {e.message}", param
        ) from e
    if schema.get("type", "object") != "object":
        raise APIError(
            INVALID, f"{param} must describe an object (type 'object'), got {schema['type']!r}",
            param,
        )  # fmt: skip


def _check_unique(tools: tuple[FunctionTool, ...]) -> None:
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if tool.name in seen:
            raise APIError(
                INVALID, f"function name {tool.name!r} repeats", f"tools.{i}.function.name"
            )
        seen.add(tool.name)


def _choice(tool_choice: Any, tools: tuple[FunctionTool, ...]) -> tuple[str, str | None]:
    if tool_choice is None:
        return "auto", None
    if isinstance(tool_choice, str):
        return tool_choice, None
    name = tool_choice.function.name
    names = [tool.name for tool in tools]
    if name not in names:
        raise APIError(
            INVALID, f"tool_choice names {name!r}, which is not one of the tools {names}",
            "tool_choice",
        )  # fmt: skip
    return "named", name
