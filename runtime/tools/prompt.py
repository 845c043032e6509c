"""Tools in the prompt for chat templates that know nothing of them.

A template that mentions ``tools`` (Qwen2.5, Hermes, Llama 3.1, ...) gets them
through ``apply_chat_template(tools=...)`` and renders calls and tool results its
own way. Any other template (SmolLM2's plain ChatML) sees this conversation instead:

    system     its content, then a block listing the tools and the call format
    assistant  with tool_calls: its content, then its calls as one section of the
               format (``format``: Hermes unless the server was told another)
    tool       a user turn: <tool_response>\\n{content}\\n</tool_response>

The block shows the exact text the grammar enforces, so what the model reads
and what it may write are the same format.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from radixlm.runtime.tools.format import HERMES, ToolFormat

__all__ = ["fallback_conversation", "template_renders_tools", "tools_block"]

_INTRO = (
    "You have functions you can call. Each is described by one JSON object on a line "
    "between <tools> and </tools>:"
)
_HOW = (
    "To call one, write exactly this, with the function's name and its arguments as "
    "{what} matching its parameters ({several}):"
)
_WHAT = {"json": "one JSON object", "xml": "one <parameter=NAME> block each"}


def template_renders_tools(chat_template: Any) -> bool:
    """Whether the model's template reads a ``tools`` variable (a str, or a dict of
    named templates)."""
    if isinstance(chat_template, dict):
        return any(template_renders_tools(t) for t in chat_template.values())
    return isinstance(chat_template, str) and "tools" in chat_template


def tools_block(tools: Sequence[dict[str, Any]], fmt: ToolFormat = HERMES) -> str:
    """The system text that lists ``tools`` (OpenAI-shaped dicts) and the call format."""
    listing = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    several = "several calls go one after another"
    if fmt.section_end:
        several = f"several calls go in one list, separated by {fmt.separator!r}"
    how = _HOW.format(what=_WHAT[fmt.arguments], several=several)
    arguments = (
        "{ARGUMENTS}" if fmt.arguments == "json" else fmt.render_arguments({"NAME": "VALUE"})
    )
    example = fmt.render_section([("FUNCTION_NAME", arguments)])
    return f"{_INTRO}\n<tools>\n{listing}\n</tools>\n{how}\n{example}"


def fallback_conversation(
    conversation: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]],
    fmt: ToolFormat = HERMES,
) -> list[dict[str, Any]]:
    """``conversation`` (OpenAI-shaped message dicts) as plain role/content turns, calls
    written in ``fmt``."""
    turns = [_plain_turn(message, fmt) for message in conversation]
    if not tools:
        return turns
    block = tools_block(tools, fmt)
    if turns and turns[0]["role"] == "system":
        first = turns[0]["content"]
        turns[0] = {"role": "system", "content": f"{first}\n\n{block}" if first else block}
    else:
        turns.insert(0, {"role": "system", "content": block})
    return turns


def _plain_turn(message: dict[str, Any], fmt: ToolFormat) -> dict[str, str]:
    content = message.get("content") or ""
    if message["role"] == "tool":
        return {"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"}
    calls = message.get("tool_calls") or []
    if calls:
        rendered = fmt.render_section([_call(call["function"], fmt) for call in calls])
        content = f"{content}\n{rendered}" if content else rendered
    return {"role": message["role"], "content": content}


def _call(function: dict[str, Any], fmt: ToolFormat) -> tuple[str, str]:
    arguments = function["arguments"]
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return function["name"], fmt.render_arguments(arguments)
