"""Checks a JSON schema before compiling it: never silently ignore a keyword.

A backend that drops a keyword it does not understand produces output that
looks constrained but is not (``uniqueItems`` ignored lets ``[1, 1]`` through).
So each backend declares the keywords it enforces; a schema using any other
keyword with validation meaning in some JSON Schema draft is rejected, naming the
keyword and where it is. Every other keyword is an annotation and is ignored, as the
specification says (``_VALIDATION_VOCABULARY``). The sets
were measured by compiling a schema per keyword and checking that a violating
value is refused (``tests/runtime/constrained/test_schema_check.py`` keeps them
honest).

Also rejected here: schemas that are not valid JSON Schema, nest deeper than a
bound, or contradict themselves (``minimum > maximum``, ...): they accept nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema

from radixlm.runtime.errors import GrammarError, UnsupportedGrammarError

__all__ = ["check_schema", "ENFORCED_KEYWORDS", "ENFORCED_FORMATS"]

# Every keyword some JSON Schema draft (draft-03 to 2020-12) gives validation meaning:
# an assertion, an applicator, or a reference. Any other keyword is an annotation the
# specification tells validators to ignore (title, description, default, examples,
# readOnly, $comment, draft-04's id, vendor x-* extensions, OpenAPI's nullable, ...):
# it is ignored here too, and neither backend reads it.
_VALIDATION_VOCABULARY = frozenset(
    {
        "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
        "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems", "minItems",
        "uniqueItems", "maxContains", "minContains", "maxProperties", "minProperties",
        "required", "dependentRequired", "allOf", "anyOf", "oneOf", "not", "if", "then",
        "else", "dependentSchemas", "prefixItems", "items", "contains", "properties",
        "patternProperties", "additionalProperties", "propertyNames", "unevaluatedItems",
        "unevaluatedProperties", "$ref", "$dynamicRef", "$recursiveRef", "$defs",
        "definitions", "format", "additionalItems", "dependencies", "divisibleBy",
        "disallow", "extends",
    }
)  # fmt: skip
_COMMON = frozenset(
    {
        "type", "properties", "required", "additionalProperties", "items", "prefixItems",
        "minItems", "maxItems", "enum", "const", "anyOf", "$ref", "$defs", "definitions",
        "minLength", "maxLength", "pattern", "format", "minProperties",
    }
)  # fmt: skip
ENFORCED_KEYWORDS: dict[str, frozenset[str]] = {
    "xgrammar": _COMMON
    | {
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "maxProperties",
        "patternProperties",
        "propertyNames",
    },  # fmt: skip
    "outlines": _COMMON,
}
ENFORCED_FORMATS: dict[str, frozenset[str]] = {
    "xgrammar": frozenset({"email", "date", "date-time", "time", "uuid", "ipv4", "uri"}),
    "outlines": frozenset({"email", "date", "date-time", "time", "uuid"}),
}
# Keywords whose value is one subschema / a list of them / a dict of them.
_ONE_SCHEMA = ("items", "additionalProperties", "propertyNames", "not", "contains", "if",
               "then", "else", "unevaluatedItems", "unevaluatedProperties")  # fmt: skip
_SCHEMA_LIST = ("prefixItems", "anyOf", "oneOf", "allOf")
_SCHEMA_DICT = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")


def check_schema(text: str, backend: str, max_depth: int) -> str:
    """Raises a ``GrammarError`` naming the problem if ``backend`` cannot enforce the
    schema ``text`` exactly; returns the schema as the backends must read it.

    The schema is validated against the meta-schema of the draft its ``$schema``
    names (2020-12 when it names none or an unknown one). A schema of an older
    draft is rewritten in 2020-12 keywords, which is what both backends read:
    draft-04's boolean ``exclusiveMinimum`` / ``exclusiveMaximum`` become bounds,
    array-form ``items`` (up to 2019-09) becomes ``prefixItems`` with
    ``additionalItems`` as ``items``.

    Raises:
        GrammarError: invalid JSON Schema, too deep, or accepting nothing.
        UnsupportedGrammarError: a keyword or format ``backend`` does not enforce.
    """
    schema = json.loads(text)
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        validator.check_schema(schema)
    except jsonschema.SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "(root)"
        raise GrammarError("json_schema", f"not a valid JSON Schema at {where}: {e.message}") from e
    if validator is not jsonschema.Draft202012Validator:
        schema = _in_2020_12_keywords(schema)
    for path, node, depth in _subschemas(schema, "#", 0):
        if depth > max_depth:
            raise GrammarError("json_schema", f"nested deeper than {max_depth} levels at {path}")
        _check_keywords(node, path, backend)
        _check_satisfiable(node, path)
    return text if validator is jsonschema.Draft202012Validator else json.dumps(schema)


def _in_2020_12_keywords(node: Any) -> Any:
    """An older draft's schema (a copy) with its keywords of changed meaning rewritten."""
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _ONE_SCHEMA:
            out[key] = (
                [_in_2020_12_keywords(v) for v in value]
                if key == "items" and isinstance(value, list)
                else _in_2020_12_keywords(value)
            )
        elif key in _SCHEMA_LIST and isinstance(value, list):
            out[key] = [_in_2020_12_keywords(v) for v in value]
        elif key in _SCHEMA_DICT and isinstance(value, dict):
            out[key] = {name: _in_2020_12_keywords(v) for name, v in value.items()}
        else:
            out[key] = value
    extra = out.pop("additionalItems", None)
    if isinstance(out.get("items"), list):  # a tuple: its positions, then the rest
        out["prefixItems"] = out.pop("items")
        if extra is not None:
            out["items"] = _in_2020_12_keywords(extra)
    for exclusive, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        flag = out.get(exclusive)
        if isinstance(flag, bool):  # draft-04: a flag on the plain bound
            del out[exclusive]
            if flag and bound in out:
                out[exclusive] = out.pop(bound)
    return out


def _subschemas(node: Any, path: str, depth: int) -> Iterator[tuple[str, dict, int]]:
    """Every object subschema with its JSON pointer and nesting depth."""
    if not isinstance(node, dict):
        return
    yield path, node, depth
    for key in _ONE_SCHEMA:
        if key in node:
            yield from _subschemas(node[key], f"{path}/{key}", depth + 1)
    for key in _SCHEMA_LIST:
        for i, sub in enumerate(node.get(key, []) if isinstance(node.get(key), list) else []):
            yield from _subschemas(sub, f"{path}/{key}/{i}", depth + 1)
    for key in _SCHEMA_DICT:
        subs = node.get(key)
        if isinstance(subs, dict):
            for name, sub in subs.items():
                yield from _subschemas(sub, f"{path}/{key}/{name}", depth + 1)


def _check_keywords(node: dict, path: str, backend: str) -> None:
    enforced = ENFORCED_KEYWORDS[backend]
    unknown = sorted(k for k in node if k in _VALIDATION_VOCABULARY and k not in enforced)
    if unknown:
        raise UnsupportedGrammarError(
            "json_schema",
            f"keyword(s) {', '.join(unknown)} at {path} are not enforced by the {backend} "
            f"backend{_elsewhere(unknown, backend, ENFORCED_KEYWORDS)}; "
            "remove them or express the constraint another way",
        )
    _check_string_families(node, path, backend)
    fmt = node.get("format")
    if fmt is not None and fmt not in ENFORCED_FORMATS[backend]:
        raise UnsupportedGrammarError(
            "json_schema",
            f"format {fmt!r} at {path} is not enforced by the {backend} backend"
            f"{_elsewhere([fmt], backend, ENFORCED_FORMATS)} (enforced: "
            f"{', '.join(sorted(ENFORCED_FORMATS[backend]))})",
        )


def _check_string_families(node: dict, path: str, backend: str) -> None:
    """Both backends enforce only one of pattern / format / length bounds on a string
    and drop the others (measured: xgrammar lets ``"abcdef"`` through ``pattern`` +
    ``maxLength: 3``; outlines ignores ``pattern`` beside ``maxLength``)."""
    families = [k for k in ("pattern", "format") if k in node]
    if "minLength" in node or "maxLength" in node:
        families.append("minLength/maxLength")
    if len(families) > 1:
        raise UnsupportedGrammarError(
            "json_schema",
            f"{' and '.join(families)} together at {path}: the {backend} backend enforces only "
            "one of them on a string; fold the length into the pattern (e.g. ^[a-z]{1,3}$)",
        )


def _elsewhere(names: list[str], backend: str, table: dict[str, frozenset[str]]) -> str:
    others = [b for b in table if b != backend and set(names) <= table[b]]
    if not others:
        return ""
    return f" (the {others[0]} backend enforces them: grammar_backend={others[0]!r})"


_BOUNDS = (
    ("minimum", "maximum"),
    ("minLength", "maxLength"),
    ("minItems", "maxItems"),
    ("minProperties", "maxProperties"),
)


def _check_satisfiable(node: dict, path: str) -> None:
    """The self-contradictions a schema can state in one node: it then accepts nothing."""
    for low, high in _BOUNDS:
        if low in node and high in node and node[low] > node[high]:
            _accepts_nothing(path, f"{low} {node[low]} > {high} {node[high]}")
    lower = max(node.get("minimum", -float("inf")), node.get("exclusiveMinimum", -float("inf")))
    upper = min(node.get("maximum", float("inf")), node.get("exclusiveMaximum", float("inf")))
    exclusive = "exclusiveMinimum" in node or "exclusiveMaximum" in node
    if lower > upper or (exclusive and lower == upper):
        _accepts_nothing(path, "the numeric range is empty")
    if node.get("enum") == []:
        _accepts_nothing(path, "enum is empty")
    if node.get("additionalProperties") is False:
        missing = sorted(set(node.get("required", [])) - set(node.get("properties", {})))
        if missing and "patternProperties" not in node:
            _accepts_nothing(
                path, f"required {missing} are not in properties and additionalProperties is false"
            )


def _accepts_nothing(path: str, why: str) -> None:
    raise GrammarError("json_schema", f"the schema accepts nothing at {path}: {why}")
