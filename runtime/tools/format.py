"""How each model family writes its tool calls: one small typed description per format.

    name         a call as the model writes it (N: newline)                  several calls
    hermes       <tool_call>N{"name": F, "arguments": {...}}N</tool_call>     N between
    llama3_json  {"name": F, "parameters": {...}}  (may follow <|python_tag|>)  "; " between
    mistral      [TOOL_CALLS] [{"name": F, "arguments": {...}}]              ", " in the list
    mistral_v11  [TOOL_CALLS]F[ARGS]{...}                                     none between
    qwen3_coder  <tool_call>N<function=F>N<parameter=K>NVN</parameter>N       N between
                 </function>N</tool_call>
    deepseek_v3  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>F   N between
                 N```jsonN{...}N```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
    granite      <|tool_call|>[{"name": F, "arguments": {...}}]              ", " in the list

All the calls of one answer make one *section*:

    section = section_begin  call (separator call)*  section_end
    call    = head(F)  arguments  tail

``trigger`` is the text a section starts with: under tool_choice "auto" the model
writes text until the trigger, then the section. Arguments are a JSON object, or
(``xml``) one ``<parameter=K>`` block per argument whose value is written raw when its
schema is a plain string (``raw_string``) and as JSON otherwise.

The grammar (``grammar``), the parser (``parser``) and the fallback prompt
(``prompt``) all read the format from here, so what the prompt shows, what the
grammar enforces and what the parser reads cannot drift apart. Which format a model
gets: ``detect_tool_format`` (its chat template's markers), or a name
(``tool_format_named``, the ``--tool-call-parser`` flag).

Many tokenizers make a format's markers special tokens (Mistral's ``[TOOL_CALLS]`` and
``[ARGS]``, Granite's ``<|tool_call|>``, Llama 3's ``<|python_tag|>``). ``tokens`` lists
the texts that may be: a request with tools reads them as text
(``SamplingParams.special_tokens_as_text``), so its grammar may write each as its one
token and the parser sees it in the output.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "DEEPSEEK_V3",
    "FORMATS",
    "GRANITE",
    "HERMES",
    "LLAMA3_JSON",
    "MISTRAL",
    "MISTRAL_V11",
    "QWEN3_CODER",
    "PARAM_CLOSE",
    "ToolFormat",
    "detect_tool_format",
    "param_open",
    "raw_string",
    "tool_format_named",
]

_NAME = "{name}"  # where the function's name goes in ``head``
PARAM_CLOSE = "\n</parameter>\n"
# A plain string schema: any keyword of these makes the value JSON (quoted) instead.
_JSON_STRING_KEYWORDS = frozenset({"pattern", "format", "contentEncoding", "contentSchema"})


@dataclass(frozen=True)
class ToolFormat:
    """One family's way of writing calls (the module docstring draws it).

    name: what ``--tool-call-parser`` calls it.
    family: the models that write it, for people.
    trigger: the text every section starts with (a prefix of ``section_begin + head``).
    head: a call up to its arguments, with ``{name}`` where the function's name goes.
    arguments: "json" (one object) or "xml" (``<parameter=K>`` blocks).
    tail: what closes a call after its arguments.
    separator, section_begin, section_end: between calls; around all of them.
    ignored_before: text a model may write just before a section (the parser drops it);
        under tool_choice "auto" writing one starts a section too.
    markers: text whose presence in a chat template says the model writes this format
        (all of them must be there).
    tokens: the format's texts that tokenizers may make special tokens (read as text
        by a request with tools; see the module docstring).
    """

    name: str
    family: str
    trigger: str
    head: str
    arguments: Literal["json", "xml"]
    tail: str
    separator: str
    section_begin: str = ""
    section_end: str = ""
    ignored_before: tuple[str, ...] = ()
    markers: tuple[str, ...] = ()
    tokens: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.arguments not in ("json", "xml"):
            raise ValueError(f"arguments must be 'json' or 'xml', got {self.arguments!r}")
        if _NAME not in self.head:
            raise ValueError(f"head must hold {_NAME!r}, got {self.head!r}")
        if not (self.section_begin + self.head).startswith(self.trigger) or not self.trigger:
            raise ValueError(f"the trigger {self.trigger!r} must begin every section")

    def call_head(self, name: str) -> str:
        """Everything a call of ``name`` writes before its arguments."""
        return self.head.replace(_NAME, name)

    def render_call(self, name: str, arguments: str) -> str:
        """One call; ``arguments`` is the arguments' text as this format writes them."""
        return self.call_head(name) + arguments + self.tail

    def render_section(self, calls: Sequence[tuple[str, str]]) -> str:
        """The calls ``(name, arguments text)`` as one section."""
        body = self.separator.join(self.render_call(name, args) for name, args in calls)
        return self.section_begin + body + self.section_end

    def render_arguments(self, arguments: Mapping[str, Any] | str) -> str:
        """Arguments (a dict, or JSON text) as this format writes them; JSON text that is
        not an object is kept as written."""
        if isinstance(arguments, str):
            try:
                parsed = json.loads(arguments)
            except json.JSONDecodeError:
                return arguments
            if self.arguments == "json" or not isinstance(parsed, dict):
                return arguments
            arguments = parsed
        if self.arguments == "json":
            return json.dumps(arguments, ensure_ascii=False)
        return "".join(
            param_open(key) + (value if isinstance(value, str) else json.dumps(value))
            + PARAM_CLOSE
            for key, value in arguments.items()
        )  # fmt: skip


def param_open(key: str) -> str:
    """The xml style's opening of argument ``key`` (its value follows on the next line)."""
    return f"<parameter={key}>\n"


def raw_string(schema: Any) -> bool:
    """Whether the xml style writes a value of ``schema`` raw (unquoted): a plain string.
    A string with a pattern or a format is written as JSON, where the grammar enforces it."""
    return (
        isinstance(schema, dict)
        and schema.get("type") == "string"
        and not _JSON_STRING_KEYWORDS & schema.keys()
    )


HERMES = ToolFormat(
    name="hermes",
    family="Hermes, Qwen2.5, Qwen3 (and the fallback prompt of templates without tools)",
    trigger="<tool_call>",
    head='<tool_call>\n{"name": "{name}", "arguments": ',
    arguments="json",
    tail="}\n</tool_call>",
    separator="\n",
    markers=("<tool_call>",),
    tokens=("<tool_call>", "</tool_call>"),
)
LLAMA3_JSON = ToolFormat(
    name="llama3_json",
    family="Llama 3.1, 3.2, 3.3 (JSON tool calling)",
    trigger='{"name": "',
    head='{"name": "{name}", "parameters": ',
    arguments="json",
    tail="}",
    separator="; ",
    ignored_before=("<|python_tag|>",),
    markers=("<|python_tag|>",),
    tokens=("<|python_tag|>",),
)
MISTRAL = ToolFormat(
    name="mistral",
    family="Mistral 7B v0.3, Mistral Nemo, Mistral Small (v3 tokenizer)",
    trigger="[TOOL_CALLS]",
    section_begin="[TOOL_CALLS] [",
    head='{"name": "{name}", "arguments": ',
    arguments="json",
    tail="}",
    separator=", ",
    section_end="]",
    markers=("[TOOL_CALLS]",),
    tokens=("[TOOL_CALLS]",),
)
MISTRAL_V11 = ToolFormat(
    name="mistral_v11",
    family="Mistral Small 3.1+, Magistral, Devstral, Ministral (v11+ tokenizers)",
    trigger="[TOOL_CALLS]",
    head="[TOOL_CALLS]{name}[ARGS]",
    arguments="json",
    tail="",
    separator="",
    markers=("[TOOL_CALLS]", "[ARGS]"),
    tokens=("[TOOL_CALLS]", "[ARGS]"),
)
QWEN3_CODER = ToolFormat(
    name="qwen3_coder",
    family="Qwen3-Coder (XML-style parameters)",
    trigger="<tool_call>",
    head="<tool_call>\n<function={name}>\n",
    arguments="xml",
    tail="</function>\n</tool_call>",
    separator="\n",
    markers=("<function=", "<parameter="),
    tokens=("<tool_call>", "</tool_call>"),
)
DEEPSEEK_V3 = ToolFormat(
    name="deepseek_v3",
    family="DeepSeek V3, R1 (0528)",
    trigger="<｜tool▁calls▁begin｜>",
    section_begin="<｜tool▁calls▁begin｜>",
    head="<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n",
    arguments="json",
    tail="\n```<｜tool▁call▁end｜>",
    separator="\n",
    section_end="<｜tool▁calls▁end｜>",
    markers=("<｜tool▁calls▁begin｜>",),
    tokens=(
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁call▁begin｜>",
        "<｜tool▁sep｜>",
        "<｜tool▁call▁end｜>",
        "<｜tool▁calls▁end｜>",
    ),
)
GRANITE = ToolFormat(
    name="granite",
    family="IBM Granite 3.x",
    trigger="<|tool_call|>",
    section_begin="<|tool_call|>[",
    head='{"name": "{name}", "arguments": ',
    arguments="json",
    tail="}",
    separator=", ",
    section_end="]",
    markers=("<|tool_call|>",),
    tokens=("<|tool_call|>",),
)

# Detection order: the first format whose markers a template holds wins. Qwen3-Coder's
# templates hold <tool_call> too, so it goes before Hermes; v11 Mistral templates hold
# [TOOL_CALLS] too, so mistral_v11 goes before mistral.
FORMATS: dict[str, ToolFormat] = {
    f.name: f
    for f in (DEEPSEEK_V3, MISTRAL_V11, MISTRAL, GRANITE, QWEN3_CODER, LLAMA3_JSON, HERMES)
}
# Other servers' names for the same formats (SGLang's --tool-call-parser values).
_ALIASES = {
    "qwen": "hermes",
    "qwen25": "hermes",
    "llama3": "llama3_json",
    "deepseekv3": "deepseek_v3",
}


def tool_format_named(name: str) -> ToolFormat:
    """The format called ``name`` (or one of SGLang's names for it).

    Raises:
        ValueError: no format is called that (the message lists them).
    """
    found = FORMATS.get(_ALIASES.get(name, name))
    if found is None:
        raise ValueError(f"no tool-call format is called {name!r}; expected one of {list(FORMATS)}")
    return found


def detect_tool_format(chat_template: Any) -> ToolFormat:
    """The format a model's chat template renders tool calls in (a str, or a dict of
    named templates): the first of ``FORMATS`` whose markers it holds; Hermes when it
    holds none (a template without tools gets the fallback prompt, which shows Hermes)."""
    if isinstance(chat_template, dict):
        text = "\n".join(t for t in chat_template.values() if isinstance(t, str))
    else:
        text = chat_template if isinstance(chat_template, str) else ""
    for fmt in FORMATS.values():
        if all(marker in text for marker in fmt.markers):
            return fmt
    return HERMES
