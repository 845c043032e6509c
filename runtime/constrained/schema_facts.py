"""What a subschema says of the values it takes, for ``schema_check``'s reading of oneOf.

``oneOf [A, B, ...]`` holds for a value matching exactly one branch. A grammar can only
say "at least one" (anyOf), so a oneOf is enforced where no value matches two branches:
then the two agree. ``SchemaFacts.told_apart`` proves two branches share no value, from
what each says for sure:

    their JSON types differ
    one requires a property whose value the other refuses (forbids it, closes the object
        without it, or gives it a schema told apart from the first one's)
    their const / enum values differ, or no value of one's enum passes the other (checked
        with jsonschema, formats included, where a checker for each format is at hand)
    every anyOf / oneOf member of one is told apart from the other
    they are strings, and no character starts a string of both (a pattern's first
        character after ^, a format's alphabet: a uuid never starts with $)

``exclusive_branches`` makes the rest exact where one of two overlapping branches is a
finite set of values: the values both take match two branches, so neither keeps them
(the finite one keeps only what the other refuses; the other gets ``not {enum: ...}``);
and where two branches are told apart within some JSON types and say nothing of the
others (``{format: uuid}`` beside ``{pattern: ^[$]}`` takes every number), which then
match both: both keep only the types they are told apart in.

Local ``$ref``s (into ``root``) and ``allOf`` members are followed; anything else is
unknown and never proves anything, so a branch pair is told apart only when it is.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from radixlm.runtime.constrained.registry import DEFINED_FORMATS
from radixlm.runtime.constrained.schema_logic import NOTE_KEYWORDS, negation
from radixlm.runtime.constrained.schema_refs import resolve_pointer

__all__ = ["SchemaFacts", "exclusive_branches"]

# How deep told_apart follows properties and branches (each a step into the schema).
_MAX_DEPTH = 4
# A finite branch with more values than this is not checked value by value.
_MAX_VALUES = 256


@dataclass
class SchemaFacts:
    """Facts about the subschemas of ``root`` (a schema whose ``$ref``s all point into
    it: ``schema_refs.hoist_refs``' output), in the keywords of ``vocabulary``."""

    root: Any
    vocabulary: frozenset[str]  # the draft's validation keywords (others annotate)
    _validators: dict[int, Any] = field(default_factory=dict, repr=False)

    def told_apart(self, a: Any, b: Any, parent: dict, depth: int = 0) -> bool:
        """Whether no value (that ``parent`` allows) matches both ``a`` and ``b``."""
        types_a, types_b = self.types(a, parent), self.types(b, parent)
        if types_a is not None and types_b is not None and not types_a & types_b:
            return True
        own_a, own_b = self.values(a), self.values(b)
        if own_a is not None and own_b is not None and not own_a & own_b:
            return True
        if depth >= _MAX_DEPTH:
            return False
        shared = _ALL_TYPES if types_a is None or types_b is None else types_a & types_b
        if shared <= {"string"}:
            starts_a, starts_b = self.first_characters(a), self.first_characters(b)
            if starts_a is not None and starts_b is not None and not starts_a & starts_b:
                return True
        for x, y, own, kinds in ((a, b, own_a, types_a), (b, a, own_b, types_b)):
            if own is not None and all(self.accepts(y, v) is False for v in own):
                return True
            if kinds == {"object"} and self._required_refused(x, y, depth):
                return True
            members = self._members(x)
            within = {"type": sorted(kinds)} if kinds else parent  # what x's members take
            if members and all(self.told_apart(m, y, within, depth + 1) for m in members):
                return True
        return False

    def accepts(self, schema: Any, value_text: str) -> bool | None:
        """Whether ``schema`` takes the JSON value ``value_text``; None where that is not
        known here (a format without a checker, a reference that does not resolve)."""
        validator = self._validator(schema)
        if validator is None:
            return None
        try:
            return validator.is_valid(json.loads(value_text))
        except Exception:  # an unresolvable $ref, a pattern Python cannot read, ...
            return None

    def types(self, schema: Any, parent: dict | None = None, depth: int = 0) -> set[str] | None:
        """Its JSON types (integer within number), None if unknown."""
        schema = self._resolved(schema, depth)
        if schema is False:
            return set()
        if not isinstance(schema, dict):
            return None
        known: list[set[str]] = []
        if "type" in schema:
            kind = schema["type"]
            known.append(_with_integer({kind} if isinstance(kind, str) else set(kind)))
        values = self._values(schema)
        if values is not None:
            known.append(_with_integer({_json_type(json.loads(v)) for v in values}))
        for member in schema.get("allOf", []):
            member_types = self.types(member, None, depth + 1)
            if member_types is not None:
                known.append(member_types)
        if parent is not None and "type" in parent:
            known.append(self.types({"type": parent["type"]}))
        if not known:
            return None
        out = known[0]
        for other in known[1:]:
            out = out & other
        return out

    def required(self, schema: Any, depth: int = 0) -> set[str]:
        schema = self._resolved(schema, depth)
        if not isinstance(schema, dict):
            return set()
        out = set(schema.get("required", []))
        for member in schema.get("allOf", []):
            out |= self.required(member, depth + 1)
        return out

    def property_schema(self, schema: Any, name: str) -> Any:
        """What ``schema`` says of property ``name``'s value (a subschema; false where it
        refuses the property), None where unknown. Only its own keywords: allOf members
        add constraints, so this says at most what the whole says."""
        schema = self._resolved(schema, 0)
        if not isinstance(schema, dict):
            return None
        declared = schema.get("properties", {})
        if name in declared:
            return declared[name]
        matching = []
        for pattern, sub in schema.get("patternProperties", {}).items():
            try:
                if re.search(pattern, name):
                    matching.append(sub)
            except re.error:
                return None
        if matching:
            return matching[0] if len(matching) == 1 else {"allOf": matching}
        extra = schema.get("additionalProperties", True)
        if extra is not True and extra != {}:
            return extra
        for member in schema.get("allOf", []):  # each applies too: one that refuses it
            if self.property_schema(member, name) is False:
                return False
        return extra

    def first_characters(self, schema: Any) -> frozenset[str] | None:
        """The characters every string ``schema`` takes starts with (none is empty),
        from its pattern or format; None where unknown."""
        schema = self._resolved(schema, 0)
        if not isinstance(schema, dict):
            return None
        known = [_FORMAT_STARTS.get(schema.get("format", ""))]
        if isinstance(schema.get("pattern"), str):
            known.append(_pattern_starts(schema["pattern"]))
        found = [k for k in known if k is not None]
        if not found:
            return None
        return frozenset.intersection(*found)

    def vacuous(self, schema: Any, kind: str) -> bool:
        """Whether ``schema`` takes every value of JSON type ``kind`` (its keywords all
        apply to other types only)."""
        schema = self._resolved(schema, 0)
        if schema is True:
            return True
        if not isinstance(schema, dict):
            return False
        others = set().union(*(v for k, v in _TYPE_KEYWORDS.items() if k != kind))
        if "type" in schema:
            kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
            if kind not in kinds:
                return False
        return all(
            key == "type" or key in others or key not in self._constraining for key in schema
        )

    def values(self, schema: Any, depth: int = 0) -> set[str] | None:
        """The JSON texts its const / enum (or an allOf member's) allows; None: any."""
        schema = self._resolved(schema, depth)
        if not isinstance(schema, dict):
            return None
        out = self._values(schema)
        for member in schema.get("allOf", []):
            member_values = self.values(member, depth + 1)
            if member_values is not None:
                out = member_values if out is None else out & member_values
        return out

    @property
    def _constraining(self) -> frozenset[str]:
        """Keywords that constrain: the draft's, and 2020-12's (a read subschema's)."""
        typed = set().union(*_TYPE_KEYWORDS.values())
        return (self.vocabulary | _STRUCTURAL | typed) - NOTE_KEYWORDS

    def _required_refused(self, x: Any, y: Any, depth: int) -> bool:
        """Whether ``x`` (an object) requires a property whose every value ``y`` refuses."""
        for name in sorted(self.required(x)):
            theirs = self.property_schema(y, name)
            if theirs is False:
                return True
            mine = self.property_schema(x, name)
            if mine is None or theirs is None or theirs is True or theirs == {}:
                continue
            if self.told_apart(mine, theirs, {}, depth + 1):
                return True
        return False

    def _members(self, schema: Any) -> list:
        """The anyOf (else oneOf) members of ``schema``: it matches one of them at least."""
        schema = self._resolved(schema, 0)
        if not isinstance(schema, dict):
            return []
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list) and schema[key]:
                return schema[key]
        return []

    def _validator(self, schema: Any) -> Any:
        """A 2020-12 validator of ``schema`` (read subschemas are in 2020-12 keywords)
        with ``root``'s definitions beside it; None where a format it names has no
        checker here."""
        key = id(schema)
        if key in self._validators:
            return self._validators[key][1]
        doc: dict[str, Any] = {"allOf": [schema]}
        for container in ("$defs", "definitions"):
            if isinstance(self.root, dict) and container in self.root:
                doc[container] = self.root[container]
        checked = _formats(schema) | (_formats(doc) if '"$ref"' in json.dumps(schema) else set())
        validator = None
        # jsonschema's import builds rfc3987_syntax's IRI grammar (about a second
        # of CPU), which every process importing the server (each CLI command) would pay
        import jsonschema  # lazy: only schema and tools requests need it

        draft = jsonschema.Draft202012Validator
        if all(f in draft.FORMAT_CHECKER.checkers for f in checked & DEFINED_FORMATS):
            try:
                draft.check_schema(doc)
                validator = draft(doc, format_checker=draft.FORMAT_CHECKER)
            except jsonschema.SchemaError:
                validator = None
        self._validators[key] = (schema, validator)  # the schema kept: its id stays its own
        return validator

    def _values(self, schema: Any) -> set[str] | None:
        if not isinstance(schema, dict):
            return None
        if "const" in schema and "const" in self.vocabulary:
            return {_text(schema["const"])}
        if isinstance(schema.get("enum"), list):
            return {_text(v) for v in schema["enum"]}
        return None

    def _resolved(self, schema: Any, depth: int) -> Any:
        """``schema``, or what its lone local ``$ref`` points at (a few hops at most)."""
        for _ in range(8 - min(depth, 8)):
            if not (isinstance(schema, dict) and isinstance(schema.get("$ref"), str)):
                return schema
            if set(schema) - NOTE_KEYWORDS - {"$ref"} or not schema["$ref"].startswith("#"):
                return None  # siblings beside the ref, or a remote one: unknown
            schema = resolve_pointer(self.root, schema["$ref"][1:])
        return None


def exclusive_branches(facts: SchemaFacts, branches: list, parent: dict) -> list | None:
    """``branches`` of a oneOf (beside ``parent``'s keywords) narrowed so that no value
    matches two, with the same values matching exactly one as before: then anyOf of
    them is the oneOf. None where a pair can be neither told apart nor narrowed."""
    out = list(branches)
    for i in range(len(branches)):
        for j in range(i + 1, len(branches)):
            if facts.told_apart(branches[i], branches[j], parent):
                continue
            for finite, other in ((i, j), (j, i)):
                narrowed = _narrowed(facts, branches[finite], branches[other])
                if narrowed is not None:
                    kept, excluded = narrowed
                    out[finite] = _both(out[finite], kept)
                    out[other] = _both(out[other], excluded)
                    break
            else:
                kinds = _apart_kinds(facts, branches[i], branches[j], parent)
                if kinds is None:
                    return None
                out[i] = _both(out[i], {"type": kinds} if kinds else False)
                out[j] = _both(out[j], {"type": kinds} if kinds else False)
    return [b for b in out if b is not False]


def _apart_kinds(facts: SchemaFacts, a: Any, b: Any, parent: dict) -> list[str] | None:
    """The JSON types within which ``a`` and ``b`` are told apart, where both take every
    value of each other type they share (so those match both, and neither keeps them);
    None otherwise."""
    apart = []
    for kind in sorted(_ALL_TYPES - {"integer"}):
        within = {"type": kind}
        if facts.told_apart(a, b, within) or facts.told_apart(within, parent, {}):
            apart.append(kind)
        elif not (facts.vacuous(a, kind) and facts.vacuous(b, kind)):
            return None
    return apart


def _narrowed(facts: SchemaFacts, finite: Any, other: Any) -> tuple[Any, Any] | None:
    """Where ``finite`` is a set of scalar values: (what it keeps: the values ``other``
    refuses, what ``other`` adds: not the values both take); None otherwise."""
    own = facts.values(finite)
    if own is None or len(own) > _MAX_VALUES:
        return None
    shared, kept = [], []
    for text in sorted(own):
        accepted = facts.accepts(other, text)
        if accepted is None:
            return None
        (shared if accepted else kept).append(json.loads(text))
    excluded = negation({"enum": shared}) if shared else True
    if excluded is None:  # an object or array both take
        return None
    return ({"enum": kept} if kept else False), excluded


_ALL_TYPES = frozenset({"null", "boolean", "object", "array", "string", "number", "integer"})
# The keywords that constrain values of one JSON type only.
_TYPE_KEYWORDS = {
    "string": frozenset({"pattern", "format", "minLength", "maxLength", "contentEncoding",
                         "contentMediaType"}),
    "number": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                         "multipleOf"}),
    "object": frozenset({"properties", "required", "additionalProperties", "patternProperties",
                         "minProperties", "maxProperties", "propertyNames", "dependentRequired",
                         "dependentSchemas", "dependencies", "unevaluatedProperties"}),
    "array": frozenset({"items", "prefixItems", "additionalItems", "minItems", "maxItems",
                        "uniqueItems", "contains", "minContains", "maxContains",
                        "unevaluatedItems"}),
}  # fmt: skip
# The keywords that constrain values of any type.
_STRUCTURAL = frozenset(
    {"type", "enum", "const", "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "$ref",
     "$dynamicRef", "unevaluatedItems", "unevaluatedProperties"}
)  # fmt: skip
_HEX = frozenset("0123456789abcdefABCDEF")
_DIGITS = frozenset("0123456789")
# The characters a string of each format starts with, where few can (every one of
# these formats is non-empty): a superset of both the specification's and llguidance's.
_FORMAT_STARTS = {
    "uuid": _HEX,
    "date": _DIGITS,
    "date-time": _DIGITS,
    "time": _DIGITS,
    "ipv4": _DIGITS,
    "duration": frozenset("P"),
}


def _pattern_starts(pattern: str) -> frozenset[str] | None:
    """The characters a string matching ``pattern`` starts with, where it is ``^``, then
    one character or a plain class (not negated), not optional: ``^[$]``, ``^\\$x``."""
    if not pattern.startswith("^") or "|" in pattern:
        return None
    match = re.match(r"\^(\[(?:\\.|[^\]\\])+\]|\\[^A-Za-z0-9]|[^\\\[\](){}|.*+?^$])", pattern)
    if match is None:
        return None
    rest = pattern[match.end() :]
    if rest[:1] in ("*", "?") or re.match(r"\{0\s*[,}]", rest):
        return None  # the atom may be absent
    atom = match[1]
    if not atom.startswith("["):
        return frozenset(atom[-1])
    return _class_characters(atom[1:-1])


def _class_characters(body: str) -> frozenset[str] | None:
    """The characters of a bracket class's ``body`` (literals, escaped punctuation and
    ranges); None for a negated class or one with \\d, \\w and the like."""
    if body.startswith("^"):
        return None
    chars: list[str] = []
    i = 0
    while i < len(body):
        if body[i] == "\\":
            if i + 1 >= len(body) or body[i + 1].isalnum():
                return None
            chars.append(body[i + 1])
            i += 2
        elif i + 2 < len(body) and body[i + 1] == "-" and body[i + 2] != "\\":
            low, high = ord(body[i]), ord(body[i + 2])
            if high < low or high - low > 1000:
                return None
            chars.extend(chr(c) for c in range(low, high + 1))
            i += 3
        else:
            chars.append(body[i])
            i += 1
    return frozenset(chars)


def _both(a: Any, b: Any) -> Any:
    if a is False or b is False:
        return False
    if b is True:
        return a
    return {"allOf": [a, b]}


def _formats(schema: Any) -> set[str]:
    """Every format value named anywhere in ``schema``."""
    if isinstance(schema, dict):
        out = {schema["format"]} if isinstance(schema.get("format"), str) else set()
        for value in schema.values():
            out |= _formats(value)
        return out
    if isinstance(schema, list):
        return set().union(*(_formats(v) for v in schema)) if schema else set()
    return set()


def _text(value: Any) -> str:
    """``value``'s JSON text, one per JSON value: keys sorted, and a number equal to an
    integer written as one (1.0 is 1 to JSON Schema; true is not 1)."""
    return json.dumps(_integral(value), sort_keys=True)


def _integral(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_integral(v) for v in value]
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    return value


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    return {float: "number", str: "string", list: "array", dict: "object"}[type(value)]


def _with_integer(types: set[str]) -> set[str]:
    """JSON Schema's integer is a number: a set with "number" holds "integer" too."""
    return types | {"integer"} if "number" in types else types
