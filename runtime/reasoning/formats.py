"""Reasoning formats: how a model family marks its thinking section, one small entry each.

    <think>\\n I should count the letters ... </think>\\n\\n{"answer": 3}
    ^ start            reasoning            ^ end      content (the answer)

A family's chat template may open the section itself (DeepSeek-R1 and Qwen3's thinking
templates end the generation prompt with ``<think>\\n``), close it before the reply
(Qwen3 with ``enable_thinking=False`` writes ``<think>\\n\\n</think>\\n\\n``), or leave it
to the model (Qwen3's hybrid template: the model writes ``<think>`` first). Where a
reply starts is read from the prompt itself (``opening_phase``); the family only says
what to assume when the prompt shows no marker (a raw prompt without the template).

``REASONING_FORMATS`` is the registry ``--reasoning-parser NAME`` picks from;
``detect_reasoning_format`` finds the entry from a chat template.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType

from radixlm.runtime.errors import InvalidRequestError

__all__ = [
    "AUTO",
    "REASONING_FORMATS",
    "Phase",
    "ReasoningFormat",
    "UnknownReasoningParserError",
    "detect_reasoning_format",
    "reasoning_format",
    "resolve_reasoning_format",
]

AUTO = "auto"  # detect from the chat template
_NONE = "none"  # no reasoning parser
_THINKING_VARIABLE = re.compile(r"\bthinking\b")  # DeepSeek-V3.1's template switch


class UnknownReasoningParserError(InvalidRequestError):
    """A reasoning parser name that is not in ``REASONING_FORMATS``."""


class Phase(Enum):
    """Where a reply stands relative to its reasoning section."""

    REASONING = "reasoning"  # inside the section: unconstrained, until the end marker
    ANSWER = "answer"  # after it (or there is none): a constraint applies here
    MAY_OPEN = "may_open"  # at the start: the model may open a section, else it answers


@dataclass(frozen=True)
class ReasoningFormat:
    """One family's reasoning markers.

    Attributes:
        name: what ``--reasoning-parser`` and the DSL's ``model_type`` call it.
        start, end: the markers around the reasoning (text; a tokenizer may hold either
            as one token or spell it in several).
        template_opens: the family's template opens the section at the end of the
            generation prompt, so a reply whose prompt shows no marker (a raw prompt)
            is still taken to start inside it (DeepSeek-R1: its models often omit
            ``<think>``). False: such a reply may open a section with ``start`` first.
    """

    name: str
    start: str = "<think>"
    end: str = "</think>"
    template_opens: bool = False

    def __post_init__(self) -> None:
        if not self.start or not self.end or self.start == self.end:
            raise ValueError(f"{self.name}: needs two distinct non-empty markers")

    def opening_phase(self, prompt: str) -> Phase:
        """Where a reply to ``prompt`` (its text, or only its tail) starts.

        The last marker in the prompt decides: a start marker (the template opened the
        section, or a prefilled reply is inside it) -> REASONING; an end marker with
        nothing but whitespace after it (the template closed the section: thinking
        off) -> ANSWER. Otherwise (no marker, or a closed section of an earlier turn)
        the family's default: REASONING if ``template_opens``, else MAY_OPEN.
        """
        tail = prompt.rstrip()
        start_at, end_at = tail.rfind(self.start), tail.rfind(self.end)
        if start_at > end_at:
            return Phase.REASONING
        if end_at >= 0 and tail.endswith(self.end):
            return Phase.ANSWER
        return Phase.REASONING if self.template_opens else Phase.MAY_OPEN

    @property
    def default_phase(self) -> Phase:
        """Where a reply starts when nothing is known of its prompt (the DSL's case)."""
        return Phase.REASONING if self.template_opens else Phase.MAY_OPEN


REASONING_FORMATS: MappingProxyType[str, ReasoningFormat] = MappingProxyType(
    {
        f.name: f
        for f in (
            # Any model that writes <think>...</think> and opens it itself.
            ReasoningFormat("think"),
            # DeepSeek-R1 and its distills (Qwen / Llama based), QwQ: the template ends
            # with "<think>\n"; older templates did not and the models often skip it.
            ReasoningFormat("deepseek-r1", template_opens=True),
            # DeepSeek-V3.1+: chat_template_kwargs {"thinking": true} opens it, else the
            # template closes it ("</think>") before the reply.
            ReasoningFormat("deepseek-v3"),
            # Qwen3 hybrid models: the model opens it; enable_thinking=False closes it in
            # the prompt. Qwen3 thinking-only models' templates open it (prompt decides).
            ReasoningFormat("qwen3"),
            # Kimi (k1.5 style) markers.
            ReasoningFormat("kimi", start="\u25c1think\u25b7", end="\u25c1/think\u25b7"),
        )
    }
)


def reasoning_format(name: str) -> ReasoningFormat:
    """The registry's entry for ``name`` (``_`` and ``-`` alike: vLLM writes
    ``deepseek_r1``, SGLang ``deepseek-r1``).

    Raises:
        UnknownReasoningParserError: no such entry; the message lists the known names.
    """
    key = name.replace("_", "-").lower() if isinstance(name, str) else name
    found = REASONING_FORMATS.get(key) if isinstance(key, str) else None
    if found is None:
        known = ", ".join(sorted(REASONING_FORMATS))
        raise UnknownReasoningParserError(
            f"unknown reasoning parser {name!r}; known ones are {known} "
            f"(or {AUTO!r}: from the chat template, {_NONE!r}: none)"
        )
    return found


def detect_reasoning_format(chat_template: str | None) -> ReasoningFormat | None:
    """The entry a chat template's text points to; None when it writes no reasoning
    markers. DeepSeek's role markers pick the DeepSeek entries (``thinking`` variable:
    V3), ``enable_thinking`` picks Qwen3's, any other ``<think>`` template the generic one."""
    if not chat_template:
        return None
    kimi = REASONING_FORMATS["kimi"]
    if kimi.start in chat_template or kimi.end in chat_template:
        return kimi
    if "<think>" not in chat_template and "</think>" not in chat_template:
        return None
    if "\uff5cAssistant\uff5c" in chat_template:  # <｜Assistant｜>
        name = "deepseek-v3" if _THINKING_VARIABLE.search(chat_template) else "deepseek-r1"
        return REASONING_FORMATS[name]
    if "enable_thinking" in chat_template:
        return REASONING_FORMATS["qwen3"]
    return REASONING_FORMATS["think"]


def resolve_reasoning_format(name: str | None, chat_template: str | None) -> ReasoningFormat | None:
    """An engine's format: ``"auto"`` detects it from ``chat_template``; ``"none"`` or
    None turns reasoning off; any other name is looked up.

    Raises:
        UnknownReasoningParserError: an unknown name.
    """
    if name is None or name == _NONE:
        return None
    if name == AUTO:
        return detect_reasoning_format(chat_template)
    return reasoning_format(name)
