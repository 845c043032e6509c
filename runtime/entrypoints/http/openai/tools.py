"""How one server's model writes tool calls, and which grammar enforces them.

    --tool-call-parser NAME ----------------------> that format
    (else) the chat template's tool markers ------> detect_tool_format (Hermes when none)
    the engine's grammar_backend  llguidance -----> a Lark grammar (tool_grammar.to_lark)
                                  auto, xgrammar -> a structural tag (to_structural_tag)

Decided once when the server starts (``ToolCalling.for_model``); a chat request may
name another format for itself (``tool_call_parser``, a radixlm extension).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from radixlm.runtime.config import GrammarConfig
from radixlm.runtime.constrained.schema_check import check_schema
from radixlm.runtime.entrypoints.http.constraints import Constraint
from radixlm.runtime.entrypoints.http.errors import INVALID, APIError
from radixlm.runtime.entrypoints.http.tool_format import (
    HERMES,
    ToolFormat,
    detect_tool_format,
    tool_format_named,
)
from radixlm.runtime.entrypoints.http.tool_grammar import to_lark, to_structural_tag, tool_grammar
from radixlm.runtime.entrypoints.http.tool_plan import ToolPlan

__all__ = ["ToolCalling"]

logger = logging.getLogger("radixlm.http")


@dataclass(frozen=True)
class ToolCalling:
    """format: the model's; grammar: the engine's grammar options (its backend, and how
    it reads a schema: depth, number bounds)."""

    format: ToolFormat = HERMES
    grammar: GrammarConfig = field(default_factory=GrammarConfig)

    @classmethod
    def for_model(
        cls, chat_template: Any, parser: str | None, grammar: GrammarConfig
    ) -> ToolCalling:
        """The format ``parser`` names, else the one ``chat_template`` renders (logged).

        Raises:
            ValueError: ``parser`` names no format.
        """
        if parser is not None:
            fmt, why = tool_format_named(parser), "--tool-call-parser"
        else:
            fmt, why = detect_tool_format(chat_template), "the chat template"
        logger.info("tool calls are read as %s (from %s)", fmt.name, why)
        return cls(fmt, grammar)

    def format_for(self, name: str | None) -> ToolFormat:
        """The format a request asks for by ``name`` (None: the model's).

        Raises:
            APIError (400, param ``tool_call_parser``): no format is called that.
        """
        if name is None:
            return self.format
        try:
            return tool_format_named(name)
        except ValueError as e:
            raise APIError(INVALID, str(e), "tool_call_parser") from e

    def constraint(self, plan: ToolPlan, fmt: ToolFormat) -> Constraint | None:
        """The grammar that enforces ``plan``'s calls in ``fmt`` (None for "none").

        Raises:
            APIError (400): a backend that compiles neither form (outlines).
            GrammarError: an arguments schema llguidance cannot enforce (as a
                json_schema request gets it).
        """
        grammar = tool_grammar(plan, fmt)
        if grammar is None:
            return None
        backend = self.grammar.grammar_backend
        if backend in ("auto", "xgrammar"):
            return Constraint("tools", "structural_tag", to_structural_tag(grammar))
        if backend == "llguidance":
            return Constraint("tools", "lark", to_lark(grammar, self._checked))
        raise APIError(
            INVALID,
            f"tool calls are enforced by xgrammar or llguidance; this server's grammar "
            f"backend is {backend!r}",
            "tools",
        )

    def _checked(self, schema: dict[str, Any]) -> dict[str, Any]:
        """``schema`` as llguidance compiles a json_schema request's (schema_check)."""
        depth, bounded = self.grammar.grammar_max_schema_depth, self.grammar.json_bounded_numbers
        checked = check_schema(json.dumps(schema), "llguidance", depth, False, bounded)
        return json.loads(checked.text)
