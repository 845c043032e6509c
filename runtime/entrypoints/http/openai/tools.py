"""Tools on the chat route: the request's ``tools`` checked into a plan, the format the
server's model writes calls in, and the grammar that enforces them.

    body.tools, body.tool_choice --tool_plan_from--> ToolPlan (or None: no tools)

Every refusal of the request's tools is a 400 naming the field the client sent
(``tools.1.function.name``, ``tool_choice``), before anything is tokenized or compiled.

    --tool-call-parser NAME ----------------------> that format
    (else) the chat template's tool markers ------> detect_tool_format (Hermes when none)
    the engine's grammar_backend compiles structural tags --> one (to_structural_tag)
                                 else Lark grammars ---------> one (tools.grammar.to_lark)

What a backend compiles is the grammar registry's to say (``REGISTRY.compiles``); this
module names no backend.

Decided once when the server starts (``ToolCalling.for_model``); a chat request may
name another format for itself (``tool_call_parser``, a radixlm extension).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from radixlm.runtime.config import GrammarConfig
from radixlm.runtime.constrained.registry import REGISTRY
from radixlm.runtime.constrained.schema_check import check_schema
from radixlm.runtime.entrypoints.http.openai.constraints import Constraint
from radixlm.runtime.entrypoints.http.openai.protocol import ChatCompletionRequest
from radixlm.runtime.entrypoints.http.server.errors import INVALID, APIError
from radixlm.runtime.tools.format import (
    HERMES,
    ToolFormat,
    detect_tool_format,
    tool_format_named,
)
from radixlm.runtime.tools.grammar import to_lark, to_structural_tag, tool_grammar
from radixlm.runtime.tools.plan import FUNCTION_NAME, NO_ARGUMENTS, FunctionTool, ToolPlan

__all__ = ["TOOL_GRAMMAR_KINDS", "ToolCalling", "tool_plan_from"]

logger = logging.getLogger("radixlm.http")
# The kinds a tool-call grammar is written in, preferred first: a structural tag (free
# text until a call's trigger; the default under "auto"), else a Lark grammar.
TOOL_GRAMMAR_KINDS = ("structural_tag", "lark")


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
        """The grammar that enforces ``plan``'s calls in ``fmt`` (None for "none"), in
        the first of ``TOOL_GRAMMAR_KINDS`` the engine's backend compiles.

        Raises:
            APIError (400): a backend that compiles neither kind.
            GrammarError: an arguments schema the Lark grammar's backend cannot
                enforce (as a json_schema request gets it).
        """
        grammar = tool_grammar(plan, fmt)
        if grammar is None:
            return None
        backend = self.grammar.grammar_backend
        kind = next((k for k in TOOL_GRAMMAR_KINDS if REGISTRY.compiles(backend, k)), None)
        if kind == "structural_tag":
            return Constraint("tools", kind, to_structural_tag(grammar))
        if kind == "lark":
            checked = partial(self._checked, REGISTRY.serving(backend, kind))
            return Constraint("tools", kind, to_lark(grammar, checked))
        able = dict.fromkeys(n for k in TOOL_GRAMMAR_KINDS for n in REGISTRY.compiling(k))
        names = " or ".join(repr(n) for n in able)
        raise APIError(
            INVALID,
            f"tool calls are enforced by a structural tag or a Lark grammar, which this "
            f"server's grammar backend {backend!r} does not compile (grammar_backend {names} "
            "does)",
            "tools",
        )

    def _checked(self, backend: str, schema: dict[str, Any]) -> dict[str, Any]:
        """``schema`` as ``backend`` compiles a json_schema request's (schema_check)."""
        grammar = self.grammar
        depth, bounded = grammar.grammar_max_schema_depth, grammar.json_bounded_numbers
        length = grammar.json_max_string_length
        checked = check_schema(json.dumps(schema), backend, depth, False, bounded, length)
        return json.loads(checked.text)


def tool_plan_from(body: ChatCompletionRequest) -> ToolPlan | None:
    """The request's plan; None when it has no tools (an empty list counts as none).

    Raises:
        APIError (400): tool_choice without tools, a bad or repeated function name, a
            parameters schema that is not a valid JSON Schema of an object, or a
            tool_choice naming no tool; ``param`` names the field.
    """
    if not body.tools:
        if body.tool_choice is not None:
            raise APIError(INVALID, "tool_choice needs tools", "tool_choice")
        return None
    tools = tuple(_function_tool(i, tool.function) for i, tool in enumerate(body.tools))
    _check_unique(tools)
    choice, name = _choice(body.tool_choice, tools)
    parallel = body.parallel_tool_calls is not False and choice != "named"
    return ToolPlan(tools, choice, name, parallel)


def _function_tool(index: int, function: Any) -> FunctionTool:
    where = f"tools.{index}.function"
    if not FUNCTION_NAME.fullmatch(function.name):
        raise APIError(
            INVALID,
            f"{where}.name must be 1-64 letters, digits, '_' or '-', got {function.name!r}",
            f"{where}.name",
        )
    parameters = NO_ARGUMENTS if function.parameters is None else function.parameters
    _check_parameters(parameters, f"{where}.parameters")
    return FunctionTool(function.name, function.description, parameters)


def _check_parameters(schema: dict[str, Any], param: str) -> None:
    # jsonschema's import builds rfc3987_syntax's IRI grammar (about a second
    # of CPU), which every process importing the server (each CLI command) would pay
    import jsonschema  # lazy: only schema and tools requests need it

    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "(root)"
        raise APIError(
            INVALID, f"{param} is not a valid JSON Schema at {where}: {e.message}", param
        ) from e
    if schema.get("type", "object") != "object":
        raise APIError(
            INVALID, f"{param} must describe an object (type 'object'), got {schema['type']!r}",
            param,
        )  # fmt: skip


def _check_unique(tools: tuple[FunctionTool, ...]) -> None:
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if tool.name in seen:
            raise APIError(
                INVALID, f"function name {tool.name!r} repeats", f"tools.{i}.function.name"
            )
        seen.add(tool.name)


def _choice(tool_choice: Any, tools: tuple[FunctionTool, ...]) -> tuple[str, str | None]:
    if tool_choice is None:
        return "auto", None
    if isinstance(tool_choice, str):
        return tool_choice, None
    name = tool_choice.function.name
    names = [tool.name for tool in tools]
    if name not in names:
        raise APIError(
            INVALID, f"tool_choice names {name!r}, which is not one of the tools {names}",
            "tool_choice",
        )  # fmt: skip
    return "named", name
