"""The one constraint a request's output must match, whichever field, in whichever
server's spelling, asked for it.

    the field the client sent                          SamplingParams field
    response_format (json_schema, json_object)         json_schema ({"type": "object"})
    json_schema (SGLang, completions)                  json_schema
    regex, ebnf, lark, choices (radixlm, SGLang)       the same
    guided_json      | structured_outputs.json         json_schema
    guided_regex     | structured_outputs.regex        regex
    guided_choice    | structured_outputs.choice       choices
    guided_grammar   | structured_outputs.grammar      ebnf, or lark (below)
    structured_outputs.json_object: true               json_schema {"type": "object"}
    structural_tag   | structured_outputs.structural_tag   structural_tag

vLLM hands a ``grammar`` to xgrammar as EBNF (GBNF: ``root ::= ...``) or, when it looks
like Lark, to a Lark reader; radixlm does the same by the one sure sign: a grammar with a
``::=`` rule is EBNF (``ebnf``, xgrammar), any other is Lark (``lark``, llguidance).

A request asks for at most one (``constrained.spec.check_one_constraint`` owns the rule):
a second is a 400 naming it as the client sent it (the order is the table's).
vLLM's options ride along: ``disable_any_whitespace`` and ``disable_fallback`` always
hold here (JSON is generated compact; no backend falls back to another), while
``whitespace_pattern`` and ``disable_additional_properties`` are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixlm.runtime.constrained.spec import check_one_constraint
from radixlm.runtime.entrypoints.http.openai.protocol import (
    ResponseFormat,
    SamplingExtras,
    StructuredOutputs,
)
from radixlm.runtime.entrypoints.http.server.errors import INVALID, APIError
from radixlm.runtime.errors import ConstraintConflictError

__all__ = ["Constraint", "grammar_field", "one_constraint", "requested_constraints"]

# json_object: any JSON object (the schema that admits every object).
ANY_OBJECT = {"type": "object"}
# radixlm's (and SGLang's) own fields, named as the engine names them.
_OWN = ("regex", "ebnf", "lark", "choices")
# vLLM's old top-level fields -> vLLM's structured_outputs keys.
_GUIDED = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}


@dataclass(frozen=True)
class Constraint:
    """One constraint: the field the client wrote it in (``param``, for errors), the
    ``SamplingParams`` field it becomes and its value there."""

    param: str
    field: str
    value: Any

    def as_fields(self) -> dict[str, Any]:
        return {self.field: self.value}


def requested_constraints(body: SamplingExtras) -> list[Constraint]:
    """Every constraint ``body`` asks for, in the table's order.

    Raises:
        APIError (400): a ``response_format`` of type json_schema without its schema.
    """
    found = []
    fmt = format_constraint(getattr(body, "response_format", None))
    if fmt is not None:
        found.append(fmt)
    json_schema = getattr(body, "json_schema", None)
    if json_schema is not None:
        found.append(Constraint("json_schema", "json_schema", json_schema))
    found += [Constraint(name, name, getattr(body, name)) for name in _OWN]
    for name, key in _GUIDED.items():
        found += _vllm_constraint(name, key, getattr(body, name))
    tag = getattr(body, "structural_tag", None)
    found.append(Constraint("structural_tag", "structural_tag", tag))
    if body.structured_outputs is not None:
        found += structured_outputs_constraints(body.structured_outputs)
    return [c for c in found if c.value is not None]


def structured_outputs_constraints(spec: StructuredOutputs) -> list[Constraint]:
    """vLLM's ``structured_outputs`` object's constraints (none when it holds options only)."""
    where = "structured_outputs."
    found = []
    for key in ("json", "regex", "choice", "grammar"):
        value = spec.json_ if key == "json" else getattr(spec, key)
        found += _vllm_constraint(where + key, key, value)
    if spec.json_object:
        found.append(Constraint(where + "json_object", "json_schema", ANY_OBJECT))
    found.append(Constraint(where + "structural_tag", "structural_tag", spec.structural_tag))
    return [c for c in found if c.value is not None]


def _vllm_constraint(param: str, key: str, value: Any) -> list[Constraint]:
    if value is None:
        return []
    if key == "grammar":
        return [Constraint(param, grammar_field(value), value)]
    field = {"json": "json_schema", "regex": "regex", "choice": "choices"}[key]
    return [Constraint(param, field, value)]


def grammar_field(grammar: str) -> str:
    """``"ebnf"`` for a grammar with a ``::=`` rule (xgrammar's EBNF / GBNF), else ``"lark"``."""
    return "ebnf" if "::=" in grammar else "lark"


def one_constraint(found: list[Constraint]) -> Constraint | None:
    """The request's constraint, if any.

    Raises:
        APIError (400, naming the second field): two constraints.
    """
    try:
        check_one_constraint((c.param, c.field) for c in found)
    except ConstraintConflictError as e:
        raise APIError(INVALID, e.reason, e.field) from e
    return found[0] if found else None


def format_constraint(response_format: ResponseFormat | None) -> Constraint | None:
    """OpenAI's ``response_format`` as a JSON schema constraint (None for ``text``)."""
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return Constraint("response_format", "json_schema", ANY_OBJECT)
    spec = response_format.json_schema
    if spec is None:
        raise APIError(
            INVALID, "response_format of type json_schema needs a json_schema", "response_format"
        )
    return Constraint("response_format", "json_schema", spec.schema_ or ANY_OBJECT)
