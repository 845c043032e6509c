"""What became of one schema on one backend, and the checks that decide it.

    compile   refused (a GrammarError: the keyword or format it names is counted)
              crash   (any other exception, here or later)
    generate  length  (finish reason length: cut at max_new_tokens, not judged)
              valid   (complete, parses, and the schema's own draft validator with its
                       format checker finds nothing)
              invalid (complete but not valid: a constraint let it through)

"invalid" is the correctness figure: a backend that compiles a schema must only let
through outputs the schema accepts, so it must be 0.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import jsonschema

__all__ = [
    "STATUSES",
    "SchemaOutcome",
    "classify_output",
    "output_violation",
    "refused_names",
    "refusal_pointers",
    "unchecked_formats",
]

STATUSES = ("valid", "invalid", "length", "refused", "crash")

_KEYWORDS = re.compile(r"keyword\(s\) (\S+(?:, \S+)*) at #")
_LENIENT_KEYWORD = re.compile(r"\bkeyword '([^']+)'")
_FORMAT = re.compile(r"format '([^']*)' at ")
_TOGETHER = re.compile(r"(\S+(?: and \S+)+) together at ")
# Where subschemas sit: one (or a list of them) under a keyword, or a dict of named ones
# (``dependencies`` values that are lists of names are skipped by ``_formats``).
_ONE_OR_LIST = frozenset(
    {"items", "additionalItems", "additionalProperties", "propertyNames", "contains", "not",
     "if", "then", "else", "unevaluatedItems", "unevaluatedProperties", "prefixItems",
     "allOf", "anyOf", "oneOf", "extends"}
)  # fmt: skip
_NAMED = frozenset(
    {"properties", "patternProperties", "definitions", "$defs", "dependentSchemas",
     "dependencies"}
)  # fmt: skip
# Refusals that name no keyword, by a phrase of their message (first match wins).
_REASONS = (
    ("grammar_compile_timeout", "compile-timeout"),
    ("not a valid JSON Schema", "invalid-schema"),
    ("nested deeper than", "too-deep"),
    ("accepts nothing", "accepts-nothing"),
    ("cannot prove exclusive", "oneOf"),
    ("circular references with sibling keys", "circular-ref-with-siblings"),
    ("intersection stack level exceeded", "intersection-too-deep"),
    ("schema too large", "too-large"),
    ("regex parse error", "regex-unsupported"),
    ("lookarounds not supported", "regex-unsupported"),
    ("cannot compile it", "backend-error"),
    ("failed:", "backend-error"),
)


@dataclass(frozen=True)
class SchemaOutcome:
    """One schema sent once through one backend.

    Attributes:
        status: one of ``STATUSES``.
        compiled: the standalone compile succeeded (a later crash may still follow).
        compile_s: that compile's wall time (None when it did not succeed).
        refused: the keyword / format names a refusal gave (``format:uri-reference``,
            ``pattern+format``, or a reason such as ``compile-timeout``).
        message: the error, or an invalid output's violation.
        text: the generated text (kept for invalid, crashed and cut ("length") outputs).
        mask_fill_s: the time of each ``fill_bitmask`` when its tokens were replayed.
        replay_error: a token the engine generated that a fresh matcher refused.
        warnings: what a lenient compile reported dropping (meta_info).
    """

    dataset: str
    name: str
    backend: str
    status: str
    compiled: bool = False
    compile_s: float | None = None
    refused: tuple[str, ...] = ()
    message: str = ""
    text: str = ""
    num_output_tokens: int = 0
    mask_fill_s: tuple[float, ...] = ()
    replay_error: str = ""
    warnings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")


def refused_names(message: str) -> tuple[str, ...]:
    """The keywords / formats a refusal names, else its reason (``other`` if unknown)."""
    names: list[str] = []
    for found in _KEYWORDS.findall(message):
        names += found.split(", ")
    names += _LENIENT_KEYWORD.findall(message)
    names += [f"format:{f}" for f in _FORMAT.findall(message)]
    names += ["+".join(t.split(" and ")) for t in _TOGETHER.findall(message)]
    if names:
        return tuple(dict.fromkeys(names))
    return next(((r,) for phrase, r in _REASONS if phrase in message), ("other",))


_POINTER = re.compile(r" at (#[^\s:;,)]*)")


def refusal_pointers(message: str) -> tuple[str, ...]:
    """The JSON pointers (``#/properties/a``) a refusal names, in order, each once."""
    return tuple(dict.fromkeys(_POINTER.findall(message)))


def output_violation(schema: dict[str, Any], text: str) -> str | None:
    """None if ``text`` is a JSON value ``schema`` accepts, else what is wrong with it.

    Checked by the validator of the draft the schema's ``$schema`` names (2020-12 if
    none), with that draft's format checker: formats whose checker needs a package
    that is missing are not checked (``unchecked_formats`` names them).
    """
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        return f"not JSON: {e}"
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls = jsonschema.validators.extend(cls, {"multipleOf": _decimal_multiple_of})
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is None:
        return None
    return f"{error.message} (at {error.json_path}, schema {'/'.join(map(str, error.schema_path))})"


def _decimal_multiple_of(validator: Any, step: Any, instance: Any, schema: Any) -> Iterator:
    """multipleOf in decimal arithmetic, as JSON numbers are written: jsonschema's own
    divides floats, and finds 19.99 no multiple of 0.01 (19.99 / 0.01 = 1998.9999...)."""
    if not validator.is_type(instance, "number"):
        return
    quotient = Decimal(str(instance)) / Decimal(str(step))
    if quotient != quotient.to_integral_value():
        yield jsonschema.ValidationError(f"{instance!r} is not a multiple of {step}")


def unchecked_formats(schema: dict[str, Any]) -> set[str]:
    """The ``format`` values in ``schema`` that its draft's format checker cannot check."""
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return set(_formats(schema)) - set(cls.FORMAT_CHECKER.checkers)


def _formats(node: Any) -> Iterator[str]:
    """The ``format`` of every subschema (annotations such as ``enum`` values, ``default``
    or Snowplow's ``self`` are not subschemas, so a ``format`` key there is not one)."""
    if not isinstance(node, dict):
        return
    if isinstance(node.get("format"), str):
        yield node["format"]
    for key, value in node.items():
        if key in _ONE_OR_LIST:
            for sub in value if isinstance(value, list) else [value]:
                yield from _formats(sub)
        elif key in _NAMED and isinstance(value, dict):
            for sub in value.values():
                yield from _formats(sub)


def classify_output(
    finish_reason: dict[str, Any] | None, text: str, schema: dict[str, Any]
) -> tuple[str, str]:
    """A finished request's status and message from its meta_info finish reason.

    Raises:
        Exception: whatever the validator raises on a schema it cannot use (an
            unresolvable ``$ref``, ...): the caller counts it as a crash.
    """
    kind = (finish_reason or {}).get("type")
    if kind == "length":
        return "length", ""
    if kind != "stop":
        return "crash", f"finished with {finish_reason}"
    violation = output_violation(schema, text)
    return ("valid", "") if violation is None else ("invalid", violation)
