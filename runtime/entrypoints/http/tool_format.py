"""The one text format a model writes a tool call in (the Hermes / Qwen convention).

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Several calls follow one another, separated by one newline. The grammar
(``tool_grammar``), the parser (``tool_parser``) and the fallback prompt
(``tool_prompt``) all take the format from here, so what the prompt shows, what
the grammar enforces and what the parser reads cannot drift apart.
"""

from __future__ import annotations

import json

__all__ = ["CALL_END", "CALL_OPEN", "CALL_SEPARATOR", "call_begin", "render_call"]

CALL_OPEN = "<tool_call>"  # the trigger: in `auto`, text until it, a call after it
CALL_END = "}\n</tool_call>"  # closes the call object, then the tag
CALL_SEPARATOR = "\n"


def call_begin(name: str) -> str:
    """Everything a call of ``name`` writes before its arguments object."""
    return f'{CALL_OPEN}\n{{"name": {json.dumps(name)}, "arguments": '


def render_call(name: str, arguments: str) -> str:
    """A whole call; ``arguments`` is JSON text (an object)."""
    return call_begin(name) + arguments + CALL_END
