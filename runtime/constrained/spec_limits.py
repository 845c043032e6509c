"""What a constraint may cost, checked in the caller before its compile is queued, and
which constraints are small enough for the compile workers' fast lane.

    GrammarSpec --check_spec_limits--> refused at once (a 400 naming the limit), or
               --is_small-----------> the fast lane (a worker kept for small compiles)
                                       or the general lane (``compile_worker``)

Every check here is linear in the spec's text and cheaper than a compile by orders of
magnitude: a length, a walk over a JSON schema's subschemas (an ``enum`` counts by its
``len``), Python's ``re`` parse of a regex. Past a limit the request never waits for a
compile worker: its refusal names the option (``GrammarConfig``):

    grammar_max_chars          regex, EBNF, Lark and choices text (a Lark grammar of
                               tens of thousands of alternatives takes llguidance
                               seconds to build, and as long again to load in the
                               engine's process)
    grammar_max_regex_size     the positions a regex expands to, counted repeats
                               multiplied through nesting (outlines' FSM for a{10000}
                               takes seconds; a{100000} never ends within a limit)
    grammar_max_enum_values    all of a schema's enum values together
    grammar_max_schema_depth   subschema nesting (the same bound ``schema_check``
                               enforces in the worker, with the same message)

Small (``is_small``) is a prediction from the text alone, so it is conservative: a
schema, structural tag or grammar of at most ``SMALL_CHARS`` characters on llguidance
or xgrammar (they build their automata lazily or quickly), a regex or choices of a few
positions on outlines (whose FSM cost grows with positions times the tokens each allows;
figures: benchmarks/README.md, "Hostile input"). A prediction that proves wrong costs
the fast lane ``compile_worker.FAST_LANE_S`` at most: the job then moves to the general
lane.
"""

from __future__ import annotations

import json
from typing import Any

from radixlm.runtime.constrained.config import GrammarConfig
from radixlm.runtime.constrained.registry import AUTO
from radixlm.runtime.constrained.schema_keywords import (
    ONE_SCHEMA_KEYWORDS,
    SCHEMA_DICT_KEYWORDS,
    SCHEMA_LIST_KEYWORDS,
    pointer_token,
)
from radixlm.runtime.constrained.spec import JSON_KINDS, GrammarSpec
from radixlm.runtime.errors import GrammarError, RequestLimitError
from radixlm.runtime.regex_size import expanded_size

__all__ = ["SMALL_CHARS", "check_spec_limits", "is_small"]

# The fast lane's size bounds (characters; positions for outlines' regexes).
SMALL_CHARS = 8192
_SMALL_OUTLINES_POSITIONS = 32
_SMALL_OUTLINES_CHOICES_CHARS = 256
# The grammar kinds whose text is the grammar itself (``grammar_max_chars``).
_TEXT_KINDS = {
    "regex": "regex", "ebnf": "EBNF grammar", "lark": "Lark grammar",
    "choices": "choices list (as JSON text)",
}  # fmt: skip
# Where a schema holds subschemas: ``schema_keywords``, and a list under ``items``
# (draft-04's tuple form); one level deeper each.
_SCHEMA_LIST = (*SCHEMA_LIST_KEYWORDS, "items")


def check_spec_limits(spec: GrammarSpec, config: GrammarConfig) -> None:
    """Refuses a spec past the cheap limits before anything compiles it.

    Raises:
        RequestLimitError: text, regex expansion or enum values past their option.
        GrammarError: a schema nested deeper than ``grammar_max_schema_depth`` (the
            worker's own check would refuse it alike), or a schema that is not JSON.
    """
    if spec.kind in _TEXT_KINDS and len(spec.text) > config.grammar_max_chars:
        raise RequestLimitError(
            spec.kind,
            "grammar_max_chars",
            f"the {_TEXT_KINDS[spec.kind]} holds {len(spec.text)} characters; at most "
            f"{config.grammar_max_chars}",
        )
    if spec.kind == "regex":
        _check_regex_size(spec.text, config.grammar_max_regex_size)
    elif spec.kind in JSON_KINDS:
        _check_schemas(spec, config)


def is_small(spec: GrammarSpec, backend: str) -> bool:
    """Whether ``spec`` is predicted to compile in well under a second on ``backend``
    (the fast lane's jobs; call after ``check_spec_limits``)."""
    if len(spec.text) > SMALL_CHARS:
        return False
    effective = spec.default_backend if backend == AUTO and spec.kind not in JSON_KINDS else backend
    if effective != "outlines":
        return True
    if spec.kind == "regex":
        return expanded_size(spec.text, _SMALL_OUTLINES_POSITIONS) <= _SMALL_OUTLINES_POSITIONS
    if spec.kind == "choices":
        return len(spec.text) <= _SMALL_OUTLINES_CHOICES_CHARS
    return False  # a JSON schema as a regex FSM: outlines' slow kind


def _check_regex_size(pattern: str, limit: int) -> None:
    size = expanded_size(pattern, limit)
    if size > limit:
        raise RequestLimitError(
            "regex",
            "grammar_max_regex_size",
            f"the regex expands to at least {size} positions (a counted repeat multiplies "
            f"what it repeats, through nesting); at most {limit}",
        )


def _check_schemas(spec: GrammarSpec, config: GrammarConfig) -> None:
    """A JSON schema's, or each schema a structural tag embeds, depth and enum values."""
    try:
        value = json.loads(spec.text)
    except (json.JSONDecodeError, RecursionError) as e:  # spec.schema_text made it JSON
        raise GrammarError(spec.kind, f"not valid JSON: {e}") from e
    schemas = [value] if spec.kind == "json_schema" else list(_embedded_schemas(value))
    walk = _SchemaWalk(config.grammar_max_schema_depth)
    for schema in schemas:
        walk.read(schema, "#", 0)
    if walk.enum_values > config.grammar_max_enum_values:
        raise RequestLimitError(
            spec.kind,
            "grammar_max_enum_values",
            f"the schema's enums hold {walk.enum_values} values in all (the largest, "
            f"{walk.largest[0]}, at {walk.largest[1]}); at most {config.grammar_max_enum_values}",
        )


def _embedded_schemas(value: Any) -> Any:
    """Every ``"json_schema": {...}`` a structural tag holds (iteratively: max_json_depth
    bounds its nesting, not its breadth)."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            schema = node.get("json_schema")
            if isinstance(schema, dict):
                yield schema
            stack.extend(v for k, v in node.items() if k != "json_schema")
        elif isinstance(node, list):
            stack.extend(node)


class _SchemaWalk:
    """One pass over a schema's subschemas: the depth bound (``schema_check``'s, which
    counts a level per subschema keyword) and the enum values, counted by length."""

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.enum_values = 0
        self.largest: tuple[int, str] = (0, "#")

    def read(self, node: Any, path: str, depth: int) -> None:
        if not isinstance(node, dict):
            return
        if depth > self.max_depth:
            raise GrammarError(
                "json_schema", f"nested deeper than {self.max_depth} levels at {path}"
            )
        enum = node.get("enum")
        if isinstance(enum, list):
            self.enum_values += len(enum)
            if len(enum) > self.largest[0]:
                self.largest = (len(enum), f"{path}/enum")
        for key, value in node.items():
            if key in ONE_SCHEMA_KEYWORDS and isinstance(value, dict):
                self.read(value, f"{path}/{key}", depth + 1)
            elif key in _SCHEMA_LIST and isinstance(value, list):
                for i, item in enumerate(value):
                    self.read(item, f"{path}/{key}/{i}", depth + 1)
            elif key in SCHEMA_DICT_KEYWORDS and isinstance(value, dict):
                for name, item in value.items():
                    self.read(item, f"{path}/{key}/{pointer_token(name)}", depth + 1)
