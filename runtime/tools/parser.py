"""Model output text -> content and tool calls, whole or as it streams, in any ToolFormat.

    "Let me check.\\n<tool_call>\\n{"name": "f", "arguments": {"x": 1}}\\n</tool_call>"
      --ToolCallParser(HERMES).parse--> content "Let me check.", calls [f({"x": 1})]

``parse(text, final=False)`` reports only what more text cannot change: content stops
before anything that may still become the format's trigger (and before trailing
whitespace), a call appears once its name is complete, its arguments grow as they are
written. So each parse of a longer prefix extends the last one, and ``ToolCallStream``
sends the difference: the deltas of a stream concatenate to the parse of the whole
output, by construction.

Arguments are always reported as JSON text: as written for JSON formats; for the xml
style (Qwen3-Coder) built as the blocks arrive, a raw string value quoted as it grows
(the tools' schemas say which values are raw, as they told the grammar).

Content is the text outside the sections, surrounding whitespace stripped. A call cut
off (``max_tokens``) is reported with the arguments written so far and
``complete=False``; a trigger not followed by a call header is content.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from radixlm.runtime.tools.format import (
    HERMES,
    PARAM_CLOSE,
    ToolFormat,
    raw_string,
)
from radixlm.runtime.tools.plan import FunctionTool

__all__ = [
    "ParsedCall",
    "ParsedOutput",
    "StreamDelta",
    "ToolCallParser",
    "ToolCallStream",
    "new_call_id",
    "parse_tool_output",
    "tool_finish_reason",
]

_FUNCTION_NAME = r"([A-Za-z0-9_-]+)"
_PARAM = re.compile(r"\s*<parameter=([^>\n]+)>\n?")
_PARAM_END = PARAM_CLOSE.rstrip("\n")  # "\n</parameter>"


@dataclass(frozen=True)
class ParsedCall:
    """name; arguments: JSON text; complete: the call's closing text was seen."""

    name: str
    arguments: str
    complete: bool


@dataclass(frozen=True)
class ParsedOutput:
    content: str
    calls: tuple[ParsedCall, ...]


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolCallParser:
    """Reads one format's calls; ``tools`` gives the xml style its schemas."""

    def __init__(self, fmt: ToolFormat = HERMES, tools: Sequence[FunctionTool] = ()) -> None:
        self.format = fmt
        self._properties = {t.name: dict(t.parameters.get("properties") or {}) for t in tools}
        self._begin = re.compile(_loose(fmt.section_begin))
        self._before_name, after_name = fmt.head.split("{name}")
        self._head = re.compile(_loose(self._before_name) + _FUNCTION_NAME + _loose(after_name))
        self._tail = re.compile(r"\s*" + _loose(fmt.tail))
        self._separator = re.compile(_loose(fmt.separator))
        self._end = re.compile(_loose(fmt.section_end))

    def parse(self, text: str, final: bool = True) -> ParsedOutput:
        """Splits ``text`` into content and calls (see the module docstring for ``final``)."""
        content: list[str] = []
        calls: list[ParsedCall] = []
        pos = 0
        trigger = self.format.trigger
        while True:
            start = text.find(trigger, pos)
            if start < 0:
                tail = text[pos:]
                content.append(tail if final else tail[: len(tail) - self._withheld(tail)])
                break
            content.append(self._drop_ignored(text[pos:start]))
            found, pos = self._section(text, start, final)
            if not found:  # no call header (yet)
                if final:
                    content.append(text[start:])
                break
            calls += found
            if not found[-1].complete or pos < 0:
                break
        joined = "".join(content)
        return ParsedOutput(joined.strip() if final else joined.lstrip().rstrip(), tuple(calls))

    def _withheld(self, tail: str) -> int:
        """How much of the end of ``tail`` may still turn out not to be content: the
        start of a trigger, or a marker the parser drops before one."""
        held = _prefix_len(tail, self.format.trigger)
        for marker in self.format.ignored_before:
            held = max(held, _prefix_len(tail, marker))
        # a marker, perhaps followed by the start of the trigger (its section may follow)
        stripped = tail[: len(tail) - held].rstrip()
        for marker in self.format.ignored_before:
            if stripped.endswith(marker):
                held = max(held, len(tail) - len(stripped) + len(marker))
        return held

    def _drop_ignored(self, text: str) -> str:
        for marker in self.format.ignored_before:
            if text.rstrip().endswith(marker):
                return text.rstrip()[: -len(marker)]
        return text

    def _section(self, text: str, at: int, final: bool) -> tuple[list[ParsedCall], int]:
        """The calls of the section at ``at``, and where the text after it starts (-1:
        the section is not closed yet)."""
        begin = self._begin.match(text, at)
        if begin is None:
            return [], at
        calls: list[ParsedCall] = []
        pos = begin.end()
        while True:
            call, pos = self._call(text, pos, final)
            if call is None:
                return calls, -1
            calls.append(call)
            if not call.complete:
                return calls, -1
            more = self._separator.match(text, pos)
            if more is not None and self._head.match(text, more.end()):
                pos = more.end()
                continue
            if more is not None and not final and self._may_open(text[more.end() :]):
                return calls, -1  # another call may be starting
            end = self._end.match(text, pos)
            if end is None:
                return calls, pos if final else -1
            if not final and end.end() == len(text):  # a separator may still follow
                return calls, -1
            return calls, end.end()

    def _may_open(self, rest: str) -> bool:
        """Whether ``rest`` may still become (or is becoming) a call's header."""
        return self._before_name.startswith(rest) or rest.startswith(self._before_name)

    def _call(self, text: str, at: int, final: bool) -> tuple[ParsedCall | None, int]:
        head = self._head.match(text, at)
        # Not final: the header's trailing whitespace may still grow; wait for the next char.
        if head is None or (not final and head.end() == len(text)):
            return None, at
        name = head.group(1)
        if self.format.arguments == "json":
            arguments, end = _json_arguments(text, head.end())
        else:
            arguments, end = self._xml_arguments(name, text, head.end(), final)
        if end is None:
            return ParsedCall(name, arguments, False), len(text)
        closing = self._tail.match(text, end)
        if closing is None:
            return ParsedCall(name, arguments, False), len(text)
        return ParsedCall(name, arguments, True), closing.end()

    def _xml_arguments(self, name: str, text: str, at: int, final: bool) -> tuple[str, int | None]:
        """The blocks from ``at`` as JSON text, and where they end (None: not yet)."""
        properties = self._properties.get(name, {})
        pairs: list[str] = []
        pos = at
        while True:
            block = _PARAM.match(text, pos)
            if block is None or (not final and block.end() == len(text)):
                body = "{" + ", ".join(pairs)
                return (body + "}", pos) if self._tail.match(text, pos) else (body, None)
            key, start = block.group(1), block.end()
            raw = raw_string(properties.get(key))
            stop = text.find(_PARAM_END, start)
            if stop < 0:  # the value is still being written
                value = text[start:] if final else text[start : len(text) - _suffix_len(text)]
                pairs.append(f"{json.dumps(key)}: {_value(value, raw, complete=False)}")
                return "{" + ", ".join(pairs), None
            pairs.append(f"{json.dumps(key)}: {_value(text[start:stop], raw, complete=True)}")
            pos = stop + len(_PARAM_END)
            if text.startswith("\n", pos):
                pos += 1


def _value(text: str, raw: bool, complete: bool) -> str:
    """A block's value as JSON text (a raw string's closing quote once complete)."""
    if not raw:
        return text
    quoted = json.dumps(text, ensure_ascii=False)
    return quoted if complete else quoted[:-1]


def _suffix_len(text: str) -> int:
    """How much of ``text``'s end may still turn out to be a block's closing."""
    return _prefix_len(text, _PARAM_END)


def _loose(literal: str) -> str:
    """A regex for ``literal`` that lets whitespace vary where JSON or the tags allow it."""
    out: list[str] = []
    for c in literal:
        if c.isspace():
            if not out or out[-1] != r"\s*":
                out.append(r"\s*")
        elif c in "{[:,":
            out += [re.escape(c), r"\s*"]
        elif c in "}]":
            out += [r"\s*", re.escape(c)]
        else:
            out.append(re.escape(c))
    return "".join(out)


def _json_arguments(text: str, start: int) -> tuple[str, int | None]:
    """The JSON object starting at ``start`` (as far as written), and where it ends."""
    end = _json_value_end(text, start)
    return (text[start:], None) if end is None else (text[start:end], end)


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


def _prefix_len(tail: str, opening: str) -> int:
    """The length of the longest end of ``tail`` that ``opening`` starts with."""
    for n in range(min(len(opening) - 1, len(tail)), 0, -1):
        if opening.startswith(tail[-n:]):
            return n
    return 0


def parse_tool_output(text: str, final: bool = True) -> ParsedOutput:
    """``text`` read as Hermes calls (the default model's format)."""
    return ToolCallParser().parse(text, final)


def tool_finish_reason(parsed: ParsedOutput, engine_reason: str | None) -> str | None:
    """The choice's finish_reason: "tool_calls" when the model stopped after a complete
    call, else the engine's."""
    if engine_reason == "stop" and parsed.calls and parsed.calls[-1].complete:
        return "tool_calls"
    return engine_reason


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

    parser: ToolCallParser = field(default_factory=ToolCallParser)
    new_id: Callable[[], str] = new_call_id
    text: str = ""
    parsed: ParsedOutput = field(default_factory=lambda: ParsedOutput("", ()))
    ids: list[str] = field(default_factory=list)

    def feed(self, delta: str, final: bool) -> StreamDelta:
        self.text += delta
        before, now = self.parsed, self.parser.parse(self.text, final)
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
