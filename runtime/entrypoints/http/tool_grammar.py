"""A ToolPlan -> the structural tag (xgrammar) that enforces its calls.

    auto      text, and wherever ``<tool_call>`` starts, a whole valid call
              (triggered tags; text may follow a call only with parallel calls)
    required  one call or more, nothing else (tags with a separator)
    named     exactly one call of that function
    none      no constraint (None)

Each tool is one tag: ``begin`` writes the call up to its arguments (the name is
fixed by the tag, so a call can only name a tool), ``content`` is the tool's
parameters schema, ``end`` closes the call. The format comes from ``tool_format``.
"""

from __future__ import annotations

import json
from typing import Any

from radixlm.runtime.entrypoints.http.tool_format import (
    CALL_END,
    CALL_OPEN,
    CALL_SEPARATOR,
    call_begin,
)
from radixlm.runtime.entrypoints.http.tool_plan import FunctionTool, ToolPlan

__all__ = ["tool_structural_tag"]

# Whitespace characters allowed in a row inside arguments: `{"a": 1}` but no rambling.
_MAX_ARGUMENT_WHITESPACE = 1


def tool_structural_tag(plan: ToolPlan) -> str | None:
    """The structural tag's JSON text for ``SamplingParams.structural_tag``; None for "none"."""
    if not plan.calls_allowed:
        return None
    tags = [_tag(tool) for tool in plan.callable_tools]
    single = not plan.parallel
    if plan.choice == "auto":
        fmt: dict[str, Any] = {
            "type": "triggered_tags",
            "triggers": [CALL_OPEN],
            "tags": tags,
            "at_least_one": False,
            "stop_after_first": single,
        }
    else:
        fmt = {
            "type": "tags_with_separator",
            "tags": tags,
            "separator": CALL_SEPARATOR,
            "at_least_one": True,
            "stop_after_first": single,
        }
    return json.dumps({"type": "structural_tag", "format": fmt}, ensure_ascii=False)


def _tag(tool: FunctionTool) -> dict[str, Any]:
    return {
        "type": "tag",
        "begin": call_begin(tool.name),
        "content": {
            "type": "json_schema",
            "json_schema": tool.parameters,
            "max_whitespace_cnt": _MAX_ARGUMENT_WHITESPACE,
        },
        "end": CALL_END,
    }
