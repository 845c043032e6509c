"""A ToolPlan in a ToolFormat -> the grammar that enforces its calls, for either backend.

    auto      text without the trigger, then (perhaps) the trigger and one section (or a
              marker the format may write before a section, then the whole section)
    required  one section of one call or more, nothing else
    named     one section of exactly one call of that function
    none      no grammar (None)

The grammar is built once as a small tree (``Lit``, ``Json``, ``Regex``, ``Seq``, ``Alt``,
``Star``, ``Opt``) and written out for the backend that compiles it:

    xgrammar    a structural tag: the tree as nested formats; "auto" is a ``dispatch``
                on the trigger that ends after the section (``to_structural_tag``)
    llguidance  a Lark grammar: JSON through ``%json``; "auto" is a lazy lexeme up to the
                trigger beside a text that never holds it (``to_lark``)

Each call names its function in a literal, so a call can only name a tool; its
arguments are the tool's parameters schema (``json``), or (``xml``) one block per
property in the schema's order, required ones always, the others optional.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from radixlm.runtime.tools.format import (
    PARAM_CLOSE,
    ToolFormat,
    param_open,
    raw_string,
)
from radixlm.runtime.tools.plan import FunctionTool, ToolPlan

__all__ = [
    "Alt",
    "Json",
    "Lit",
    "Opt",
    "Regex",
    "Seq",
    "Star",
    "ToolGrammar",
    "to_lark",
    "to_structural_tag",
    "tool_grammar",
]

# Whitespace characters allowed in a row inside arguments: `{"a": 1}` but no rambling.
_MAX_ARGUMENT_WHITESPACE = 1
# What llguidance's %json reads for its separators and whitespace (as xgrammar's above).
_LARK_JSON_OPTIONS = {
    "item_separator": ",",
    "key_separator": ":",
    "whitespace_flexible": True,
    "whitespace_pattern": f"[\\x20\\x0A\\x0D\\x09]{{0,{_MAX_ARGUMENT_WHITESPACE}}}",
    "coerce_one_of": False,
    "lenient": False,
}
_REGEX_META = frozenset(".^$*+?()[]{}|\\/-&~")
_REGEX_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_DEFS = ("$defs", "definitions")


@dataclass(frozen=True)
class Lit:
    text: str


@dataclass(frozen=True)
class Json:
    schema: dict[str, Any]


@dataclass(frozen=True)
class Regex:
    pattern: str


@dataclass(frozen=True)
class Seq:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Alt:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Star:
    item: Node


@dataclass(frozen=True)
class Opt:
    item: Node


Node = Lit | Json | Regex | Seq | Alt | Star | Opt


@dataclass(frozen=True)
class ToolGrammar:
    """trigger: None when the output is the section alone; else free text comes first and
    ``section`` is what follows the trigger. prefixed: under "auto", the other texts
    that start a section (a format's ``ignored_before``: Llama 3's ``<|python_tag|>``),
    each with what follows it (the whole section)."""

    trigger: str | None
    section: Node
    prefixed: tuple[tuple[str, Node], ...] = ()

    @property
    def rules(self) -> tuple[tuple[str, Node], ...]:
        """Under "auto": each text that starts a section, and what follows it."""
        assert self.trigger is not None
        return ((self.trigger, self.section), *self.prefixed)


def tool_grammar(plan: ToolPlan, fmt: ToolFormat) -> ToolGrammar | None:
    """The calls ``plan`` allows, written in ``fmt``; None for "none"."""
    if not plan.calls_allowed:
        return None
    tools = plan.callable_tools
    first = Alt(tuple(_call(fmt, tool, fmt.section_begin) for tool in tools))
    parts: list[Node] = [first]
    if plan.parallel:
        later = Alt(tuple(_call(fmt, tool) for tool in tools))
        parts.append(Star(Seq((Lit(fmt.separator), later))))
    parts.append(Lit(fmt.section_end))
    if plan.choice != "auto":
        return ToolGrammar(None, Seq(tuple(parts)))
    after = Alt(tuple(_call(fmt, tool, fmt.section_begin, len(fmt.trigger)) for tool in tools))
    whole = Seq(tuple(parts))
    prefixed = tuple((marker, whole) for marker in fmt.ignored_before)
    return ToolGrammar(fmt.trigger, Seq((after, *parts[1:])), prefixed)


def _call(fmt: ToolFormat, tool: FunctionTool, before: str = "", skip: int = 0) -> Node:
    """One call of ``tool``, after ``before``, its first ``skip`` characters left out."""
    head = (before + fmt.call_head(tool.name))[skip:]
    return Seq((Lit(head), _arguments(fmt, tool.parameters), Lit(fmt.tail)))


def _arguments(fmt: ToolFormat, schema: dict[str, Any]) -> Node:
    if fmt.arguments == "json":
        return Json(schema)
    defs = {key: schema[key] for key in _DEFS if key in schema}
    properties = dict(schema.get("properties") or {})
    required = list(schema.get("required") or [])
    for key in required:
        properties.setdefault(key, {})
    blocks: list[Node] = []
    for key, sub in properties.items():
        block = Seq((Lit(param_open(key)), _xml_value(sub, defs)))
        blocks.append(block if key in required else Opt(block))
    return Seq(tuple(blocks))


def _xml_value(schema: Any, defs: dict[str, Any]) -> Node:
    """A value and the close of its block: JSON, or a raw string without '<' (so it
    cannot close its block early). A raw string and its close are one regex: a lexer
    (llguidance's) could not tell a newline in the value from the close's."""
    raw = raw_string(schema)
    strings = [v for v in schema.get("enum", ()) if isinstance(v, str)] if raw else []
    if not raw or ("enum" in schema and not strings):
        sub = schema if isinstance(schema, dict) else {}
        sub = {**sub, **defs} if defs and "$ref" in json.dumps(sub) else sub
        return Seq((Json(sub), Lit(PARAM_CLOSE)))
    if "const" in schema:
        return Lit(str(schema["const"]) + PARAM_CLOSE)
    if "enum" in schema:
        return Alt(tuple(Lit(v + PARAM_CLOSE) for v in strings))
    low = int(schema.get("minLength", 0))
    high = schema.get("maxLength")
    length = f"{{{low},{'' if high is None else int(high)}}}"
    return Regex(f"[^<]{length}{_regex_literal(PARAM_CLOSE)}")


# ---- xgrammar: a structural tag --------------------------------------------------------


def to_structural_tag(grammar: ToolGrammar) -> str:
    """The structural tag's JSON text (``SamplingParams.structural_tag``)."""
    if grammar.trigger is None:
        body = _tag_format(grammar.section)
    else:
        rules = [[trigger, _tag_format(section)] for trigger, section in grammar.rules]
        body = {"type": "dispatch", "rules": rules, "loop": False}
    return json.dumps({"type": "structural_tag", "format": body}, ensure_ascii=False)


def _tag_format(node: Node) -> dict[str, Any]:
    if isinstance(node, Lit):
        return {"type": "const_string", "value": node.text}
    if isinstance(node, Json):
        return {
            "type": "json_schema",
            "json_schema": node.schema,
            "max_whitespace_cnt": _MAX_ARGUMENT_WHITESPACE,
        }
    if isinstance(node, Regex):
        return {"type": "regex", "pattern": node.pattern}
    if isinstance(node, Seq | Alt):
        kind = "sequence" if isinstance(node, Seq) else "or"
        items = [_tag_format(item) for item in node.items if item != Lit("")]
        if len(items) == 1:
            return items[0]
        return {"type": kind, "elements": items or [{"type": "const_string", "value": ""}]}
    kind = "star" if isinstance(node, Star) else "optional"
    return {"type": kind, "content": _tag_format(node.item)}


# ---- llguidance: a Lark grammar --------------------------------------------------------


def to_lark(grammar: ToolGrammar, check_schema: Callable[[dict], dict]) -> str:
    """The Lark grammar's text (``SamplingParams.lark``); ``check_schema`` turns each
    arguments schema into what llguidance must compile (raising for what it cannot)."""
    rules: list[str] = []
    if grammar.trigger is None:
        start = [f"start: {_lark(grammar.section, rules, check_schema)}"]
    else:
        # One lazy head per text that starts a section: it ends at that text's first
        # occurrence; TEXT is the answer that holds none of them.
        triggers = [_regex_literal(trigger) for trigger, _ in grammar.rules]
        heads = [f"head_{i}" for i in range(len(triggers))]
        sections = [_lark(section, rules, check_schema) for _, section in grammar.rules]
        any_trigger = triggers[0] if len(triggers) == 1 else f"({'|'.join(triggers)})"
        start = [
            "start: " + " | ".join(["TEXT", *map(" ".join, zip(heads, sections, strict=True))]),
            f"TEXT: /(?s:.*)/ & ~/(?s:.*){any_trigger}(?s:.*)/",
            *(f"{h}[lazy]: /(?s:.*){t}/" for h, t in zip(heads, triggers, strict=True)),
        ]
    return "\n".join(["%llguidance {}", *start, *rules]) + "\n"


def _lark(node: Node, rules: list[str], check: Callable[[dict], dict]) -> str:
    """``node`` as a Lark expression; JSON schemas become rules appended to ``rules``."""
    if isinstance(node, Lit):
        return json.dumps(node.text, ensure_ascii=False) if node.text else ""
    if isinstance(node, Json):
        name = f"json_{len(rules)}"
        schema = {**check(node.schema), "x-guidance": _LARK_JSON_OPTIONS}
        rules.append(f"{name}: %json {json.dumps(schema, ensure_ascii=False)}")
        return name
    if isinstance(node, Regex):
        return f"/{node.pattern}/"
    if isinstance(node, Seq):
        return " ".join(p for p in (_lark(item, rules, check) for item in node.items) if p)
    if isinstance(node, Alt):
        return "(" + " | ".join(_lark(item, rules, check) or '""' for item in node.items) + ")"
    inner = _lark(node.item, rules, check)
    return f"({inner})*" if isinstance(node, Star) else f"({inner})?"


def _regex_literal(text: str) -> str:
    """``text`` as a regex matching it literally (inside Lark's /.../)."""
    return "".join(_REGEX_ESCAPES.get(c, "\\" + c if c in _REGEX_META else c) for c in text)
