"""Model output text -> content and tool calls, whole or as it streams.

    "Let me check.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>"
      --parse_tool_output--> content "Let me check.", calls [f({"x": 1})]

``parse_tool_output(text, final=False)`` reports only what more text cannot
change: content stops before anything that may still become ``<tool_call>``
(and before trailing whitespace), a call appears once its name is complete,
its arguments grow as they are written. So each parse of a longer prefix
extends the last one, and ``ToolCallStream`` sends the difference: the
deltas of a stream concatenate to the parse of the whole output, by construction.

Content is the text outside the calls, surrounding whitespace stripped. A call
cut off (``max_tokens``) is reported with the arguments written so far and
``complete=False``; an opening tag not followed by a call header is content.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from radixlm.runtime.entrypoints.http.tool_format import CALL_OPEN

__all__ = [
    "ParsedCall",
    "ParsedOutput",
    "StreamDelta",
    "ToolCallStream",
    "new_call_id",
    "parse_tool_output",
    "tool_finish_reason",
]

_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"([A-Za-z0-9_-]+)"\s*,\s*"arguments"\s*:\s*')
_CLOSING = re.compile(r"\s*\}\s*</tool_call>")


@dataclass(frozen=True)
class ParsedCall:
    """name; arguments: JSON text as written; complete: the closing tag was seen."""

    name: str
    arguments: str
    complete: bool


@dataclass(frozen=True)
class ParsedOutput:
    content: str
    calls: tuple[ParsedCall, ...]


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_tool_output(text: str, final: bool = True) -> ParsedOutput:
    """Splits ``text`` into content and calls (see the module docstring for ``final``)."""
    content: list[str] = []
    calls: list[ParsedCall] = []
    pos = 0
    while True:
        start = text.find(CALL_OPEN, pos)
        if start < 0:
            tail = text[pos:]
            content.append(tail if final else tail[: len(tail) - _open_prefix_len(tail)])
            break
        content.append(text[pos:start])
        call, pos = _parse_call(text, start + len(CALL_OPEN), final)
        if call is None:  # no header (yet)
            if final:
                content.append(text[start:])
            break
        calls.append(call)
        if not call.complete:
            break
    joined = "".join(content)
    return ParsedOutput(joined.strip() if final else joined.lstrip().rstrip(), tuple(calls))


def tool_finish_reason(parsed: ParsedOutput, engine_reason: str | None) -> str | None:
    """The choice's finish_reason: "tool_calls" when the model stopped after a complete
    call, else the engine's."""
    if engine_reason == "stop" and parsed.calls and parsed.calls[-1].complete:
        return "tool_calls"
    return engine_reason


def _parse_call(text: str, at: int, final: bool) -> tuple[ParsedCall | None, int]:
    """The call whose header starts at ``at``, and where parsing goes on after it."""
    header = _HEADER.match(text, at)
    # Not final: the header's trailing whitespace may still grow; wait for the next char.
    if header is None or (not final and header.end() == len(text)):
        return None, at
    args_start = header.end()
    args_end = _json_value_end(text, args_start)
    if args_end is None:
        return ParsedCall(header.group(1), text[args_start:], False), len(text)
    arguments = text[args_start:args_end]
    closing = _CLOSING.match(text, args_end)
    if closing is None:
        return ParsedCall(header.group(1), arguments, False), len(text)
    return ParsedCall(header.group(1), arguments, True), closing.end()


def _json_value_end(text: str, start: int) -> int | None:
    """Where the JSON object or array starting at ``start`` ends (None: not yet)."""
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        c = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth <= 0:
                return i + 1
    return None


def _open_prefix_len(tail: str) -> int:
    """The length of the longest end of ``tail`` that ``<tool_call>`` starts with."""
    for n in range(min(len(CALL_OPEN) - 1, len(tail)), 0, -1):
        if CALL_OPEN.startswith(tail[-n:]):
            return n
    return 0


@dataclass(frozen=True)
class StreamDelta:
    """New content, and OpenAI's ``tool_calls`` delta entries, since the last feed."""

    content: str = ""
    tool_calls: tuple[dict[str, Any], ...] = ()

    def to_openai(self) -> dict[str, Any]:
        """The chunk's ``delta`` (empty when nothing is new)."""
        delta: dict[str, Any] = {}
        if self.content:
            delta["content"] = self.content
        if self.tool_calls:
            delta["tool_calls"] = list(self.tool_calls)
        return delta


@dataclass
class ToolCallStream:
    """One choice's stream: ``feed`` each text delta; it returns what to send.

    A call's first entry carries ``index``, ``id``, ``type``, the name and the
    arguments written so far (often ""); later ones carry ``index`` and argument
    fragments.
    """

    new_id: Callable[[], str] = new_call_id
    text: str = ""
    parsed: ParsedOutput = field(default_factory=lambda: ParsedOutput("", ()))
    ids: list[str] = field(default_factory=list)

    def feed(self, delta: str, final: bool) -> StreamDelta:
        self.text += delta
        before, now = self.parsed, parse_tool_output(self.text, final)
        self.parsed = now
        entries = [self._entry(i, call, before) for i, call in enumerate(now.calls)]
        content = now.content[len(before.content) :]
        return StreamDelta(content, tuple(e for e in entries if e is not None))

    def _entry(self, index: int, call: ParsedCall, before: ParsedOutput) -> dict | None:
        if index >= len(before.calls):
            self.ids.append(self.new_id())
            function = {"name": call.name, "arguments": call.arguments}
            return {"index": index, "id": self.ids[index], "type": "function", "function": function}
        fragment = call.arguments[len(before.calls[index].arguments) :]
        if not fragment:
            return None
        return {"index": index, "function": {"arguments": fragment}}
