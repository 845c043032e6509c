"""What a request asks its output to match, normalised and checked before anything compiles.

``GrammarSpec`` is hashable (it keys the compiled-grammar cache): a JSON schema
given as a dict, a JSON string or a pydantic model class becomes one canonical
JSON string; choices become a tuple. A structural tag (xgrammar's
``{"type": "structural_tag", "format": ...}``: free text with triggered,
schema-checked tags, or tags only) is canonical JSON text too.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from radixlm.runtime.constrained.registry import REGISTRY
from radixlm.runtime.errors import ConstraintConflictError, GrammarError

__all__ = [
    "GrammarSpec", "GRAMMAR_KINDS", "JSON_KINDS", "BACKEND_NAMES", "check_one_constraint",
    "choices_regex", "schema_text",
]  # fmt: skip

GRAMMAR_KINDS = ("regex", "json_schema", "ebnf", "lark", "choices", "structural_tag")
# The kinds whose JSON is generated from schemas (number bounds apply to them).
JSON_KINDS = ("json_schema", "structural_tag")
BACKEND_NAMES = REGISTRY.choices()  # what a request's grammar_backend may name: "auto" too
# Regex metacharacters; escaping only these keeps the pattern valid for Rust's regex
# crate (outlines-core), Python's re and interegular alike.
_REGEX_META = frozenset(".^$*+?()[]{}|\\")


@dataclass(frozen=True)
class GrammarSpec:
    """One constraint.

    Attributes:
        kind: "regex", "json_schema", "ebnf", "lark", "choices" or "structural_tag".
        text: the regex, the canonical JSON schema, the EBNF or Lark grammar,
            (choices) the JSON list of options, or the structural tag's canonical JSON.
        max_whitespace: JSON only: how many whitespace characters may separate
            tokens (0 = compact ``{"a":1,"b":2}``).
        lenient: JSON only: drop the keywords the backend cannot enforce, with a
            warning each, instead of refusing the schema.
        bounded_numbers: JSON schema and structural tags: keep numbers the schema leaves
            unbounded within what JSON parsers hold exactly (``json_numbers``). None: the
            engine's ``json_bounded_numbers`` (GrammarCompiler resolves it before the
            cache lookup; a backend given None bounds, as that option's default does).
        special_tokens: the special tokens (by content) this grammar may write as one
            token each, such as a tool call's ``[TOOL_CALLS]``: it compiles over the
            vocabulary variant that spells them (``TokenVocabulary.with_special_tokens``;
            GrammarCompiler keeps only those the tokenizer has, sorted).
        max_string_length: JSON schema and structural tags: the ``maxLength`` of every
            string the schema leaves unbounded (``json_strings``); 0: none. None: the
            engine's ``json_max_string_length`` (resolved as ``bounded_numbers`` is; a
            backend given None bounds none).
    """

    kind: str
    text: str
    max_whitespace: int = 0
    lenient: bool = False
    bounded_numbers: bool | None = None
    max_string_length: int | None = None
    special_tokens: tuple[str, ...] = ()

    @property
    def choices(self) -> tuple[str, ...]:
        assert self.kind == "choices"
        return tuple(json.loads(self.text))

    @property
    def default_backend(self) -> str:
        """The backend its kind gets when nothing names one (``registry.REGISTRY``:
        llguidance for JSON schema and Lark, xgrammar for EBNF and structural tags,
        outlines for regex and choices; each entry says why). A JSON schema under "auto"
        goes to xgrammar where llguidance refuses it (``compile_worker.auto_backends``)."""
        return REGISTRY.default_for(self.kind)

    @property
    def bounds_numbers(self) -> bool:
        """Whether the backend bounds its JSON numbers (None reads as the default)."""
        return self.bounded_numbers is not False

    @property
    def string_bound(self) -> int | None:
        """The length strings the schema leaves open are bounded to; None: unbounded."""
        return self.max_string_length or None

    def as_regex(self) -> str:
        """The regex of a regex or choices spec."""
        return choices_regex(self.choices) if self.kind == "choices" else self.text


def check_one_constraint(given: Iterable[tuple[str, str]]) -> tuple[str, str] | None:
    """The rule that a request asks for at most one constraint, whatever it calls it.

    Args:
        given: each constraint the request sets, in the caller's order, as (its name as
            the caller spells it, such as ``guided_json``; the ``GRAMMAR_KINDS`` kind it
            becomes).

    Returns:
        The one pair, or None when there is none.

    Raises:
        ConstraintConflictError: a second constraint (named, with the first).
        ValueError: a pair's kind is not one of ``GRAMMAR_KINDS`` (the caller's bug).
    """
    pairs = list(given)
    for _, kind in pairs:
        if kind not in GRAMMAR_KINDS:
            raise ValueError(f"expected a constraint kind in {GRAMMAR_KINDS}, got {kind!r}")
    if len(pairs) > 1:
        raise ConstraintConflictError(pairs[0][0], pairs[1][0])
    return pairs[0] if pairs else None


def choices_regex(choices: tuple[str, ...]) -> str:
    """An alternation that matches exactly one of ``choices``, literally.

    Longest first: outlines-core builds its DFA with leftmost-first semantics, so in
    ``(yes|yesterday)`` the match "yes" shadows "yesterday" (measured).
    """
    ordered = sorted(choices, key=len, reverse=True)
    escaped = ("".join("\\" + c if c in _REGEX_META else c for c in choice) for choice in ordered)
    return "(" + "|".join(escaped) + ")"


def schema_text(schema: Any, field: str = "json_schema") -> str:
    """A JSON schema (dict, JSON string or pydantic model class) as compact JSON text.

    Key order is kept: it is the order properties are generated in.

    Raises:
        GrammarError: not a JSON object, not valid JSON, or nested too deeply to parse.
    """
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        schema = schema.model_json_schema()
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise GrammarError(field, f"not valid JSON: {e}") from e
        except RecursionError as e:  # the engine's max_json_depth is far below this
            raise GrammarError(field, "JSON nested too deeply to read") from e
    if not isinstance(schema, dict):
        raise GrammarError(
            field, f"expected a JSON object, a JSON string or a pydantic model, got {schema!r}"
        )
    try:
        return json.dumps(schema, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise GrammarError(field, f"not serialisable as JSON: {e}") from e
