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
        character after ^, a format's alphabet: a uuid never starts with $, a URI with .)
    they are strings, and one holds a character the other's alphabet lacks (a pattern's
        literal characters, ``^[class]{m,n}$``'s class, a format's)
    they are strings, and their patterns' automata share no string (``schema_patterns``)

``exclusive_branches`` makes the rest exact where one of two overlapping branches is a
finite set of values: the values both take match two branches, so neither keeps them
(the finite one keeps only what the other refuses; the other gets ``not {enum: ...}``);
and where two branches are told apart within some JSON types and say nothing of the
others (``{format: uuid}`` beside ``{pattern: ^[$]}`` takes every number), which then
match both: both keep only the types they are told apart in.

Past that it narrows, keeping every output valid but not every valid value, where a
schema says which branch a value is meant for and leaves a corner both take:

    one branch takes every value of a JSON type (``{required: [a]}`` takes every array)
        and the other some: the other does not keep the type (what it took matched
        both); the first keeps what the other refuses (exact) where ``negation`` writes
        that, else it does not keep the type either
    objects told apart by a property neither requires (``kind: {const: a}`` beside
        ``kind: {const: b}``; closed objects each declaring what the other refuses):
        each branch requires it (``{}`` matched both; an object of one branch without
        it is dropped)
    arrays whose items are told apart: each holds one (``[]`` matched both)
    overlapping branches each keeping what the other refuses, where ``not {type:
        integer}`` is written as the other types (the numbers that are not integers
        left out)

Two overlapping branches that ``negation`` writes the complement of each keep what the
other refuses (exact); the same branch twice takes nothing (a value matching one matches
both). A oneOf that none of this proves is left to the backend (llguidance refuses it).

``SchemaFacts.implies`` proves one subschema takes only values another takes (a closed
object whose properties imply the other's, an array whose items do), so that where both
apply (a declared property a pattern property also matches) the first alone says it.

Local ``$ref``s (into ``root``) and ``allOf`` members are followed; anything else is
unknown and never proves anything, so a branch pair is told apart only when it is.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from radixlm.runtime.constrained.registry import DEFINED_FORMATS
from radixlm.runtime.constrained.schema_logic import NOTE_KEYWORDS, negation, pattern_literal
from radixlm.runtime.constrained.schema_patterns import patterns_apart
from radixlm.runtime.constrained.schema_refs import resolve_pointer

__all__ = ["SchemaFacts", "exclusive_branches"]

# How deep told_apart follows properties and branches (each a step into the schema).
_MAX_DEPTH = 4
# A finite branch with more values than this is not checked value by value.
_MAX_VALUES = 256
# How deep implies follows properties, items and branches.
_MAX_IMPLIES_DEPTH = 8
_LOWER_BOUNDS = frozenset({"minimum", "exclusiveMinimum", "minLength", "minItems",
                           "minProperties"})  # fmt: skip
_UPPER_BOUNDS = frozenset({"maximum", "exclusiveMaximum", "maxLength", "maxItems",
                           "maxProperties"})  # fmt: skip
_CONTAINER_KEYS = frozenset({"$defs", "definitions"})
# Keywords whose values are JSON data, not subschemas.
_DATA_KEYS = frozenset({"enum", "const", "default", "examples"})
_DRAFT_04_FLAGS = ("exclusiveMinimum", "exclusiveMaximum")
# How many references deep ``inlined`` replaces.
_MAX_INLINED = 4


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
        shared = (_ALL_TYPES if types_a is None else types_a) & (
            _ALL_TYPES if types_b is None else types_b
        )
        if shared <= {"string"}:
            starts_a, starts_b = self.first_characters(a), self.first_characters(b)
            if starts_a is not None and starts_b is not None and not starts_a & starts_b:
                return True
            for x, y in ((a, b), (b, a)):
                if self._literal_refused(x, y) or self._characters_apart(x, y):
                    return True
            resolved_a, resolved_b = self._resolved(a, 0), self._resolved(b, 0)
            if _prefixes_apart(resolved_a, resolved_b):
                return True
            if _ranges_apart(resolved_a, resolved_b, _LENGTH_BOUNDS):
                return True
            if _patterns_apart(resolved_a, resolved_b):  # the costliest: last
                return True
        if shared <= {"number", "integer"}:
            if _ranges_apart(self._resolved(a, 0), self._resolved(b, 0), _NUMBER_BOUNDS):
                return True
        for x, y, own, kinds in ((a, b, own_a, types_a), (b, a, own_b, types_b)):
            if own is not None and all(self.accepts(y, v) is False for v in own):
                return True
            if shared <= {"object"} and self._required_refused(x, y, depth):
                return True
            members = self._members(x)
            within = {"type": sorted(kinds)} if kinds else parent  # what x's members take
            if members and all(self.told_apart(m, y, within, depth + 1) for m in members):
                return True
        return False

    def implies(self, a: Any, b: Any) -> bool:
        """Whether every value ``a`` takes ``b`` takes too (so ``a`` and ``b`` together say
        what ``a`` says); False where that is not proven here."""
        return self._implies(a, b, 0, set())

    def _implies(self, a: Any, b: Any, depth: int, assumed: set[tuple[str, str]]) -> bool:
        a, b = self._resolved(a, 0), self._resolved(b, 0)
        if a is False or b is True or b == {}:
            return True
        if a is None or b is None or depth >= _MAX_IMPLIES_DEPTH:
            return False
        pair = (_constraints(a), _constraints(b))
        if pair[0] == pair[1] or pair in assumed:
            return True  # the same; or being proven for a value holding this one
        if not (isinstance(a, dict) and isinstance(b, dict)):
            return False
        values = self.values(a)
        if values is not None and len(values) <= _MAX_VALUES:
            if all(self.accepts(b, v) is True for v in values):
                return True
        members = a.get("allOf", [])
        if isinstance(members, list) and any(
            self._implies(m, b, depth + 1, assumed) for m in members
        ):
            return True
        inner = assumed | {pair}  # for the values inside this one only
        return all(self._implies_keyword(a, b, key, depth, assumed, inner) for key in b)

    def _implies_keyword(
        self,
        a: dict,
        b: dict,
        key: str,
        depth: int,
        assumed: set[tuple[str, str]],
        inner: set[tuple[str, str]],
    ) -> bool:
        """Whether every value ``a`` takes passes ``b``'s keyword ``key`` (``inner``: the
        pairs assumed for the properties' and items' values)."""
        value = b[key]
        if key in NOTE_KEYWORDS or key not in self._constraining or key in _CONTAINER_KEYS:
            return True
        kinds = self.types(a)
        for kind, keys in _TYPE_KEYWORDS.items():
            if key in keys and kinds is not None and not _with_integer(kinds) & {kind}:
                return True  # a takes no value this keyword applies to
        if key == "type":
            other = self.types({"type": value})
            return kinds is not None and other is not None and kinds <= other
        if key == "required":
            return set(value) <= self.required(a)
        if key in _LOWER_BOUNDS or key in _UPPER_BOUNDS:
            mine = a.get(key)
            if not isinstance(mine, (int, float)) or isinstance(mine, bool):
                return False
            return mine >= value if key in _LOWER_BOUNDS else mine <= value
        if key in ("pattern", "format"):
            return a.get(key) == value
        if key in ("enum", "const"):
            own = self.values(a)
            return own is not None and own <= (self._values({key: value}) or set())
        if key == "items":
            if a.get("maxItems") == 0:
                return True  # a holds no item
            return self._implies(self.items_schema(a), value, depth + 1, inner)
        if key == "properties" and isinstance(value, dict):
            for name, theirs in value.items():
                mine = self.property_schema(a, name)
                if mine is None or not self._implies(mine, theirs, depth + 1, inner):
                    return False
            return True
        if key == "additionalProperties":
            if "patternProperties" in b:
                return False
            if a.get("additionalProperties", True) is not False or "patternProperties" in a:
                return False
            declared = set(b.get("properties", {}))
            return all(
                self._implies(schema, value, depth + 1, inner)
                for name, schema in a.get("properties", {}).items()
                if name not in declared
            )
        if key == "allOf" and isinstance(value, list):
            return all(self._implies(a, m, depth + 1, assumed) for m in value)
        if key == "anyOf" and isinstance(value, list):
            return any(self._implies(a, m, depth + 1, assumed) for m in value)
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

    def property_schema(self, schema: Any, name: str, depth: int = 0) -> Any:
        """What ``schema`` says of property ``name``'s value (a subschema; false where it
        refuses the property), None where unknown: its own keywords, else an allOf
        member's (each applies too), so this says at most what the whole says."""
        schema = self._resolved(schema, depth)
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
        if depth >= _MAX_DEPTH:
            return extra
        said = [] if extra is True or extra == {} else [extra]
        for member in schema.get("allOf", []):  # each applies too
            theirs = self.property_schema(member, name, depth + 1)
            if theirs is False:
                return False
            if theirs not in (None, True, {}):
                said.append(theirs)
        if not said:
            return extra
        return said[0] if len(said) == 1 else {"allOf": said}

    def property_names(self, schema: Any) -> set[str]:
        """The properties ``schema`` (or one of its allOf members) declares by name."""
        schema = self._resolved(schema, 0)
        if not isinstance(schema, dict):
            return set()
        out = set(schema.get("properties", {}))
        for member in schema.get("allOf", []):
            out |= self.property_names(member)
        return out

    def items_schema(self, schema: Any) -> Any:
        """The one subschema every item of ``schema``'s arrays matches (its ``items``,
        no ``prefixItems``), None where there is none or it is unknown."""
        schema = self._resolved(schema, 0)
        if not isinstance(schema, dict) or "prefixItems" in schema:
            return None
        return schema.get("items")

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

    def vacuous(self, schema: Any, kind: str, depth: int = 0) -> bool:
        """Whether ``schema`` takes every value of JSON type ``kind`` (its keywords, and
        its allOf members', all apply to other types only)."""
        schema = self._resolved(schema, depth)
        if schema is True:
            return True
        if not isinstance(schema, dict):
            return False
        others = set().union(*(v for k, v in _TYPE_KEYWORDS.items() if k != kind))
        if "type" in schema:
            kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
            if kind not in kinds:
                return False
        members = schema.get("allOf", [])
        if members and (depth >= _MAX_DEPTH or not isinstance(members, list)):
            return False
        if not all(self.vacuous(member, kind, depth + 1) for member in members):
            return False
        return all(
            key in ("type", "allOf") or key in others or key not in self._constraining
            for key in schema
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

    def _characters_apart(self, x: Any, y: Any) -> bool:
        """Whether every string of ``x`` holds a character no string of ``y`` can (an
        IPv6 address a colon, never in an IPv4 one; ``.*[{].*`` a brace, never in a
        ``^[a-z]+$``), from their formats and patterns."""
        x, y = self._resolved(x, 0), self._resolved(y, 0)
        if not (isinstance(x, dict) and isinstance(y, dict)):
            return False
        needs = [_FORMAT_NEEDS.get(x.get("format", ""))]
        needs += [frozenset(c) for c in _pattern_needs(x.get("pattern"))]
        alphabets = [_FORMAT_ALPHABETS.get(y.get("format", ""))]
        alphabets.append(_pattern_alphabet(y.get("pattern")))
        excluded = _pattern_excluded(y.get("pattern"))
        return any(
            need is not None
            and (
                any(alphabet is not None and not need & alphabet for alphabet in alphabets)
                or (excluded is not None and need <= excluded)
            )
            for need in needs
        )

    def _literal_refused(self, x: Any, y: Any) -> bool:
        """Whether ``x``'s pattern takes one string only (``^Abs$``) and ``y``'s pattern
        does not take it (or ``y``'s const / enum strings do not hold it)."""
        x, y = self._resolved(x, 0), self._resolved(y, 0)
        if not (isinstance(x, dict) and isinstance(y, dict)):
            return False
        if x.get("maxLength") == 0:
            taken: tuple[str, ...] = ("",)
        elif (literal := pattern_literal(x.get("pattern"))) is not None:
            taken = (literal, literal + "\n")  # a search's $ also matches before a last newline
        else:
            return False
        values = self._values(y)
        if values is not None:
            return not {_text(t) for t in taken} & values
        pattern = y.get("pattern")
        if not isinstance(pattern, str):
            return False
        try:
            return all(re.search(pattern, t) is None for t in taken)
        except re.error:
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

    def inlined(self, schema: Any, depth: int = 0) -> Any:
        """A copy of ``schema`` with its local ``$ref``s replaced by what they point at
        (a few levels deep), for ``negation`` to read; ``schema`` itself where a target
        is unknown, deeper, or written in keywords 2020-12 reads otherwise (draft-04's
        ``const`` and numeric exclusive bounds mean nothing there)."""
        out = self._inlined(schema, depth)
        return schema if out is None else out

    def _inlined(self, schema: Any, depth: int) -> Any:
        if isinstance(schema, list):
            items = [self._inlined(v, depth) for v in schema]
            return None if any(i is None for i in items) else items
        if not isinstance(schema, dict):
            return schema
        if "$ref" in schema:
            if depth >= _MAX_INLINED or set(schema) - NOTE_KEYWORDS != {"$ref"}:
                return None
            target = self._resolved({"$ref": schema["$ref"]}, 0)
            if target is None or ("const" not in self.vocabulary and _reads_otherwise(target)):
                return None
            return self._inlined(target, depth + 1)
        out: dict[str, Any] = {}
        for key, value in schema.items():
            if key in _DATA_KEYS or key in _CONTAINER_KEYS:
                out[key] = value
                continue
            inner = self._inlined(value, depth)
            if inner is None:
                return None
            out[key] = inner
        return out

    def resolved(self, schema: Any) -> Any:
        """``schema``, or what its lone local ``$ref`` points at (``schema`` itself where
        that is not known)."""
        found = self._resolved(schema, 0)
        return schema if found is None else found

    def _resolved(self, schema: Any, depth: int) -> Any:
        """``schema``, or what its lone local ``$ref`` points at (a few hops at most); a
        ``$ref`` with keywords beside it (2020-12: both apply) as those keywords with the
        reference as one more allOf member."""
        for _ in range(8 - min(depth, 8)):
            if not (isinstance(schema, dict) and isinstance(schema.get("$ref"), str)):
                return schema
            if not schema["$ref"].startswith("#"):
                return None  # a remote one: unknown
            siblings = {k: v for k, v in schema.items() if k != "$ref"}
            if set(siblings) - NOTE_KEYWORDS:
                ref = {"$ref": schema["$ref"]}
                return {**siblings, "allOf": [*siblings.get("allOf", []), ref]}
            schema = resolve_pointer(self.root, schema["$ref"][1:])
        return None


def _reads_otherwise(schema: Any) -> bool:
    """Whether a draft-04 subschema holds a keyword 2020-12 reads otherwise: ``const``
    (an annotation in draft-04), a numeric ``exclusiveMinimum`` / ``exclusiveMaximum``
    (draft-04's are flags), array-form ``items``, ``dependencies``."""
    if isinstance(schema, list):
        return any(_reads_otherwise(v) for v in schema)
    if not isinstance(schema, dict):
        return False
    if "const" in schema or "dependencies" in schema or isinstance(schema.get("items"), list):
        return True
    if any(k in schema and not isinstance(schema[k], bool) for k in _DRAFT_04_FLAGS):
        return True
    return any(_reads_otherwise(v) for k, v in schema.items() if k not in _DATA_KEYS)


def exclusive_branches(facts: SchemaFacts, branches: list, parent: dict) -> list | None:
    """``branches`` of a oneOf (beside ``parent``'s keywords) narrowed so that no value
    matches two, every value they keep matching exactly one as before: then anyOf of
    them takes only what the oneOf takes (all of it, but for the narrowings of the
    module docstring). None where a pair can be neither told apart nor narrowed."""
    out = list(branches)
    for i in range(len(branches)):
        for j in range(i + 1, len(branches)):
            if _same_schema(facts, branches[i], branches[j]):
                out[i] = out[j] = False  # a value matching one matches the other too
                continue
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
                narrowing = _apart_within_kinds(facts, branches[i], branches[j], parent)
                if narrowing is None:
                    narrowing = _each_without_other(facts, branches[i], branches[j])
                if narrowing is None:
                    return None
                out[i] = _both(out[i], narrowing[0])
                out[j] = _both(out[j], narrowing[1])
    return [b for b in out if b is not False]


def _same_schema(facts: SchemaFacts, a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` say the same (their texts, annotations aside, equal: the
    same $ref, or the same keywords), so no value matches one of them alone."""
    return _constraints(facts.resolved(a)) == _constraints(facts.resolved(b))


def _constraints(schema: Any) -> str:
    if isinstance(schema, dict):
        schema = {k: v for k, v in schema.items() if k not in NOTE_KEYWORDS}
    return json.dumps(schema, sort_keys=True)


def _each_without_other(facts: SchemaFacts, a: Any, b: Any) -> tuple[Any, Any] | None:
    """(``not b``, ``not a``): each branch keeps what the other refuses, where ``negation``
    writes both: exact, else narrowing (``not {type: integer}`` leaves out the numbers
    that are not integers); None where it does not."""
    exact = negation(facts.inlined(a)), negation(facts.inlined(b))
    if exact[0] is not None and exact[1] is not None:
        return exact[1], exact[0]
    narrowed = negation(facts.inlined(a), True), negation(facts.inlined(b), True)
    if narrowed[0] is None or narrowed[1] is None:
        return None
    for branch, other in ((a, 1), (b, 0)):
        if exact[other] is None:  # narrowed: it must keep some type of its own
            mine, kept = facts.types(branch), facts.types(narrowed[other])
            if mine is not None and kept is not None and not mine & kept:
                return None
    return narrowed[1], narrowed[0]


def _apart_within_kinds(facts: SchemaFacts, a: Any, b: Any, parent: dict) -> tuple[Any, Any] | None:
    """What ``a`` and ``b`` each add so that no value matches the two, judged type by
    type (None where some type they share can be neither told apart nor narrowed):

        told apart within the type             nothing
        both take every value of the type      neither keeps the type (it matched both)
        one takes every value of the type      the other does not keep the type (what it
                                               took matched both); the first keeps what
                                               the other refuses (``negation``), or, where
                                               that has no negation here, not the type
                                               (unless it would then keep no type at all)
        objects, a property told apart         both require it (``_discriminator``)
        objects, each declares a property      each requires its own
          the other refuses
        arrays, their items told apart         both hold an item (``[]`` matched both)

    The narrowings drop values that matched exactly one branch only where the module
    docstring says."""
    kinds: list[str] = []
    extra: tuple[dict[str, Any], dict[str, Any]] = ({}, {})
    pieces: tuple[list[Any], list[Any]] = ([], [])  # (a type, what it keeps of it)
    lossy = [False, False]  # dropped a type it took values of that only it matched
    piece_kinds: tuple[set[str], set[str]] = (set(), set())
    for kind in sorted(_ALL_TYPES - {"integer"}):
        within = {"type": kind}
        vacuous = (facts.vacuous(a, kind), facts.vacuous(b, kind))
        if facts.told_apart(a, b, within) or facts.told_apart(within, parent, {}):
            kinds.append(kind)
        elif all(vacuous):
            continue
        elif any(vacuous):
            taker = 0 if vacuous[0] else 1  # keeps what the other refuses
            refused = negation(facts.inlined((b, a)[taker]))
            if refused is None:
                lossy[taker] = True
            elif refused is not False:
                pieces[taker].append({"allOf": [within, refused]})
                piece_kinds[taker].add(kind)
        elif kind == "object" and (name := _discriminator(facts, a, b)) is not None:
            kinds.append(kind)
            extra[0]["required"] = extra[1]["required"] = [name]
        elif kind == "object" and (names := _refused_by_other(facts, a, b)) is not None:
            kinds.append(kind)
            extra[0]["required"], extra[1]["required"] = [names[0]], [names[1]]
        elif kind == "array" and _items_apart(facts, a, b):
            kinds.append(kind)
            extra[0]["minItems"] = extra[1]["minItems"] = 1
        else:
            return None
    out = []
    for side in (0, 1):
        options = [{"type": kinds, **extra[side]}] if kinds else []
        options += pieces[side]
        own = facts.types((a, b)[side], parent)
        kept = _with_integer(set(kinds) | piece_kinds[side])
        if lossy[side] and (not options or (own is not None and not own & kept)):
            return None  # it would keep nothing, though it took values only it matched
        out.append(
            False if not options else options[0] if len(options) == 1 else {"anyOf": options}
        )
    return out[0], out[1]


def _refused_by_other(facts: SchemaFacts, a: Any, b: Any) -> tuple[str, str] | None:
    """A property ``a`` declares that ``b`` refuses, and one ``b`` declares that ``a``
    refuses (closed objects with different properties): requiring each its own tells
    them apart."""
    found = []
    for x, y in ((a, b), (b, a)):
        names = [
            name
            for name in sorted(facts.property_names(x))
            if facts.property_schema(x, name) is not False
            and facts.property_schema(y, name) is False
        ]
        if not names:
            return None
        found.append(names[0])
    return found[0], found[1]


def _discriminator(facts: SchemaFacts, a: Any, b: Any) -> str | None:
    """A property both objects declare with subschemas no value matches both of."""
    declared = [facts.property_names(x) for x in (a, b)]
    for name in sorted(declared[0] & declared[1]):
        mine, theirs = facts.property_schema(a, name), facts.property_schema(b, name)
        if any(x is None or x is True or x is False or x == {} for x in (mine, theirs)):
            continue  # unknown, anything, or refused (``_refused_by_other``'s case)
        if facts.told_apart(mine, theirs, {}):
            return name
    return None


def _items_apart(facts: SchemaFacts, a: Any, b: Any) -> bool:
    """Whether no value matches both arrays' ``items`` (each one schema for every item)."""
    mine, theirs = facts.items_schema(a), facts.items_schema(b)
    if mine in (None, True, {}) or theirs in (None, True, {}):
        return False
    return facts.told_apart(mine, theirs, {})


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
_LETTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
# The characters a string of each format starts with, where few can (every one of
# these formats is non-empty): a superset of both the specification's and llguidance's.
_FORMAT_STARTS = {
    "uuid": _HEX,
    "date": _DIGITS,
    "date-time": _DIGITS,
    "time": _DIGITS,
    "ipv4": _DIGITS,
    "duration": frozenset("P"),
    "uri": _LETTERS,  # a scheme first (RFC 3986, section 3.1)
    "iri": _LETTERS,
}

# Each string of these formats holds one of these characters at least ...
_FORMAT_NEEDS = {
    "ipv6": frozenset(":"),
    "date-time": frozenset("Tt"),
    "time": frozenset(":"),
    "email": frozenset("@"),
    "uri": frozenset(":"),  # after the scheme
    "iri": frozenset(":"),
}
# ... and each string of these only these characters.
_FORMAT_ALPHABETS = {
    "ipv4": _DIGITS | frozenset("."),
    "date": _DIGITS | frozenset("-"),
    "uuid": _HEX | frozenset("-"),
    "hostname": _LETTERS | _DIGITS | frozenset("-."),
}


def _pattern_starts(pattern: str) -> frozenset[str] | None:
    """The characters a string matching ``pattern`` starts with, where it is ``^``, then
    one character or a plain class (not negated), not optional: ``^[$]``, ``^\\$x``."""
    pieces = _pattern_pieces(pattern) if pattern.startswith("^") else None
    if pieces is None or any(a == "|" and d == 0 for a, _, d in pieces):
        return None  # an alternative may start otherwise
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


# One piece of a pattern: an escape, a class, a group's parenthesis (non-capturing too),
# an alternative's bar, or a character; then its quantifier (lazy or not).
_PIECE = re.compile(
    r"(?P<atom>\\.|\[(?:\\.|[^\]\\])+\]|\(\?:|[()|]|[^\\\[\]()|*+?])"
    r"(?P<rep>[*+?]|\{\d+(?:,\d*)?\})?\??"
)
# The characters of the class escapes an alphabet may hold.
_ESCAPE_CLASSES = {"d": _DIGITS, "w": _LETTERS | _DIGITS | frozenset("_")}


def _pattern_pieces(pattern: str) -> list[tuple[str, str, int]] | None:
    """Each piece of ``pattern`` as (atom, quantifier, group depth): a group opens as
    ``(`` and closes as ``)`` carrying the group's quantifier. None for what this does
    not read (lookarounds, named groups, flags, unbalanced parentheses)."""
    pieces: list[tuple[str, str, int]] = []
    depth, at = 0, 0
    while at < len(pattern):
        if pattern.startswith("(?", at) and not pattern.startswith("(?:", at):
            return None
        match = _PIECE.match(pattern, at)
        if match is None:
            return None
        atom, rep = match["atom"], match["rep"] or ""
        if atom in ("(", "(?:"):
            depth += 1
            atom = "("
        elif atom == ")":
            depth -= 1
            if depth < 0:
                return None
        pieces.append((atom, rep, depth))
        at = match.end()
    return pieces if depth == 0 else None


def _optional(rep: str) -> bool:
    return rep in ("*", "?") or re.fullmatch(r"\{0\s*(,\d*)?\}", rep) is not None


def _pattern_needs(pattern: Any) -> set[str]:
    """The characters every string ``pattern`` matches holds: its literal characters
    (escaped punctuation too) outside groups and not optional, where it has no ``|``
    outside groups (what groups hold is not read)."""
    pieces = _pattern_pieces(pattern) if isinstance(pattern, str) else None
    if pieces is None or any(a == "|" and d == 0 for a, _, d in pieces):
        return set()
    needs: set[str] = set()
    for i, (atom, rep, depth) in enumerate(pieces):
        if depth > 0 or atom in "()" or _optional(rep):
            continue
        if i in (0, len(pieces) - 1) and atom in "^$":
            continue
        if atom[0] == "\\" and not atom[1].isalnum():
            needs.add(atom[1])
        elif len(atom) == 1 and atom not in ".^$":
            needs.add(atom)
    return needs


def _pattern_alphabet(pattern: Any) -> frozenset[str] | None:
    """The characters a string matching ``pattern`` is made of, where it is anchored
    (``^...$``) and made of plain classes, literal characters, ``\\d`` and ``\\w``,
    groups and alternatives (``^[a-zA-Z0-9_-]+/[a-z.]+$``); else None."""
    if not isinstance(pattern, str) or not pattern.startswith("^") or not pattern.endswith("$"):
        return None
    if pattern.endswith("\\$"):
        return None
    pieces = _pattern_pieces(pattern[1:-1])
    if pieces is None:
        return None
    chars: set[str] = {"\n"}  # a search's $ passes a last newline
    for atom, _, _ in pieces:
        if atom in "()|":
            continue
        if atom.startswith("["):
            inside = _class_characters(atom[1:-1])
            if inside is None:
                return None
            chars |= inside
        elif atom[0] == "\\":
            if atom[1] in _ESCAPE_CLASSES:
                chars |= _ESCAPE_CLASSES[atom[1]]
            elif atom[1].isalnum():
                return None
            else:
                chars.add(atom[1])
        elif atom in ".^$":
            return None
        else:
            chars.add(atom)
    return frozenset(chars)


def _pattern_excluded(pattern: Any) -> frozenset[str] | None:
    """The characters no string matching ``pattern`` holds, where it is ``^C...$`` with C
    one negated class repeated (``^[^:]+$``); else None."""
    if not isinstance(pattern, str):
        return None
    match = re.fullmatch(r"\^\[\^((?:\\.|[^\]\\])+)\](?:[*+?]|\{\d+(?:,\d*)?\})?\$", pattern)
    return None if match is None else _class_characters(match[1])


# (lower bound, exclusive lower bound, upper bound, exclusive upper bound) keywords
_LENGTH_BOUNDS = ("minLength", None, "maxLength", None)
_NUMBER_BOUNDS = ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")


def _ranges_apart(a: Any, b: Any, keywords: tuple[str | None, ...]) -> bool:
    """Whether ``a``'s and ``b``'s bounds (string lengths or numbers, 2020-12 keywords)
    leave no value between both: one's upper bound below the other's lower one."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return False
    low, low_x, high, high_x = keywords

    def bound(schema: dict, key: str | None) -> float | None:
        value = schema.get(key) if key else None
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return value if ok else None

    for x, y in ((a, b), (b, a)):
        top, top_x = bound(x, high), bound(x, high_x)
        bottom, bottom_x = bound(y, low), bound(y, low_x)
        for upper, open_upper in ((top, False), (top_x, True)):
            for lower, open_lower in ((bottom, False), (bottom_x, True)):
                if upper is None or lower is None:
                    continue
                if upper < lower or (upper == lower and (open_upper or open_lower)):
                    return True
    return False


def _pattern_prefix(pattern: Any) -> str | None:
    """The literal text every string matching ``pattern`` starts with (``^pkg:cargo/``
    gives ``pkg:cargo/``), where it is anchored and starts with such text; else None."""
    if not isinstance(pattern, str) or not pattern.startswith("^") or "|" in pattern:
        return None
    match = re.match(r"\^((?:[A-Za-z0-9 _:/@=,;<>'\"-]|\\[^A-Za-z0-9])+)", pattern)
    if match is None:
        return None
    text = match[1]
    rest = pattern[match.end() :]
    if rest[:1] in ("*", "?", "{"):  # the last character may be absent (or repeated)
        text = text[:-2] if text.endswith("\\", 0, len(text) - 1) else text[:-1]
    text = re.sub(r"\\(.)", r"\1", text)
    return text or None


def _prefixes_apart(a: Any, b: Any) -> bool:
    """Whether ``a``'s and ``b``'s patterns start every string with literal texts
    neither of which starts the other."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return False
    mine, theirs = _pattern_prefix(a.get("pattern")), _pattern_prefix(b.get("pattern"))
    if mine is None or theirs is None:
        return False
    return not (mine.startswith(theirs) or theirs.startswith(mine))


def _patterns_apart(a: Any, b: Any) -> bool:
    """Whether ``a``'s and ``b``'s patterns share no string (their automata's
    intersection is empty: ``schema_patterns``)."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return False
    return patterns_apart(a.get("pattern"), b.get("pattern"))


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
