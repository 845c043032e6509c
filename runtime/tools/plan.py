"""What a request allows of tool calls: its functions and its ``tool_choice``, typed.

    body.tools, body.tool_choice --tool_plan_from (http/openai/tools.py)--> ToolPlan

The plan owns nothing but the client's choices; the grammar (``grammar``) and the
parser (``parser``) read it. The request's checks (a 400 naming the field) are the
HTTP edge's, in ``tool_plan_from``; here a bad plan is a ``ValueError``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CHOICES", "FUNCTION_NAME", "NO_ARGUMENTS", "FunctionTool", "ToolPlan"]

CHOICES = ("none", "auto", "required", "named")
# OpenAI's rule for function names; it also keeps a name literal inside the call's JSON.
FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
NO_ARGUMENTS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class FunctionTool:
    """One function the model may call; ``parameters`` is a JSON schema of an object."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] = field(default_factory=lambda: dict(NO_ARGUMENTS))

    def __post_init__(self) -> None:
        if not FUNCTION_NAME.fullmatch(self.name):
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
