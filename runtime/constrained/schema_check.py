"""Reads a JSON schema the way its draft means it, then decides keyword by keyword what a
backend will enforce: a constraint is enforced exactly or refused by name, never dropped.

A backend that drops a keyword it does not understand produces output that looks
constrained but is not (``uniqueItems`` ignored lets ``[1, 1]`` through). So::

    text --parse, meta-validate by $schema's draft--> schema
         --read each subschema (a copy)-->  in 2020-12 keywords, for one backend:
             keyword of no validation meaning in this draft -> an annotation: ignored
             older draft's keyword of changed meaning       -> its 2020-12 spelling
             a no-op (uniqueItems: false, then without if)  -> removed
             rewritable into keywords the backend enforces  -> rewritten (``rewrites``:
             an object listing its properties, no others    -> closed   llguidance)
             anything else with validation meaning          -> UnsupportedGrammarError
                                                               naming keyword and pointer,
                                                               or, lenient, dropped with
                                                               a warning
         --> CheckedSchema(text the backend compiles, warnings)

Which keywords have validation meaning is per draft (draft-04, -06, -07, 2019-09,
2020-12; ``$schema`` chooses, 2020-12 when it names none): jsonschema's own validator
table for that draft. Which ones a backend enforces (its registry entry's
``JsonSchemaSupport``, in ``registry``) was measured by compiling a schema per keyword
and checking that a violating value is refused
(``tests/runtime/constrained/test_schema_check.py`` keeps the tables honest).

Also rejected here: schemas that are not valid JSON Schema, nest deeper than a
bound, or contradict themselves (``minimum > maximum``, ...): they accept nothing.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
from dataclasses import dataclass, field
from typing import Any

from radixlm.runtime.constrained.format_regex import (
    FORMAT_PATTERNS,
    FORMAT_SUBSETS,
    STRICTER_FORMATS,
)
from radixlm.runtime.constrained.json_numbers import bound_schema
from radixlm.runtime.constrained.registry import DEFINED_FORMATS, REGISTRY, JsonSchemaSupport
from radixlm.runtime.constrained.schema_facts import SchemaFacts, exclusive_branches
from radixlm.runtime.constrained.schema_keywords import (
    ONE_SCHEMA_KEYWORDS,
    SCHEMA_DICT_KEYWORDS,
    SCHEMA_LIST_KEYWORDS,
    pointer_token,
)
from radixlm.runtime.constrained.schema_logic import (
    NOTE_KEYWORDS,
    complement_regex,
    conditional,
    discriminator_table,
    negation,
    pattern_literal,
)
from radixlm.runtime.constrained.schema_patterns import assertion_inside, portable_pattern
from radixlm.runtime.constrained.schema_refs import hoist_refs
from radixlm.runtime.errors import GrammarError, UnsupportedGrammarError

__all__ = ["CheckedSchema", "check_schema", "load_drafts"]

# The most anyOf branches a closed object's minProperties / maxProperties is read as
# (which of its optional properties are present).
MAX_COUNTED_BRANCHES = 64
# draft-03's validation keywords (no meta-schema of ours reads draft-03: refused by name).
_DRAFT_03 = frozenset({"divisibleBy", "disallow", "extends"})
# Subschema containers that $ref may point into whatever the draft: kept and read.
_CONTAINERS = frozenset({"$defs", "definitions"})


@dataclass(frozen=True)
class _Drafts:
    """jsonschema's draft validators and what each gives validation meaning.

    vocabulary: draft validator class -> its keywords (``_vocabulary``).
    any_draft: every keyword some draft gives validation meaning. A keyword outside it
        is an annotation in every draft (title, description, default, examples,
        readOnly, $comment, draft-04's id, vendor x-* extensions, OpenAPI's nullable,
        ...): kept and ignored.
    """

    jsonschema: Any
    vocabulary: dict[type, frozenset[str]]
    any_draft: frozenset[str]


def load_drafts() -> None:
    """Imports jsonschema and reads its drafts now (once a process), so that the first
    schema checked does not pay for it inside its compile's time limit: grammar backends
    call this when they are built."""
    _drafts()


@functools.cache
def _drafts() -> _Drafts:
    """The drafts, read when the first schema is checked (or ``load_drafts``)."""
    # jsonschema's import builds rfc3987_syntax's IRI grammar (about a second
    # of CPU), which every process importing the server (each CLI command) would pay
    import jsonschema  # lazy: only schema and tools requests need it

    drafts = (
        jsonschema.Draft4Validator,
        jsonschema.Draft6Validator,
        jsonschema.Draft7Validator,
        jsonschema.Draft201909Validator,
        jsonschema.Draft202012Validator,
    )
    vocabulary = {draft: _vocabulary(draft, jsonschema) for draft in drafts}
    any_draft = frozenset().union(*vocabulary.values()) | _DRAFT_03
    return _Drafts(jsonschema, vocabulary, any_draft)


def _vocabulary(draft: type, jsonschema: Any) -> frozenset[str]:
    """The keywords with validation meaning in ``draft``: its validators, the keywords
    its validators read beside them, and the subschema containers."""
    words = set(draft.VALIDATORS) | _CONTAINERS
    if draft is jsonschema.Draft4Validator:  # flags read by its minimum / maximum
        words |= {"exclusiveMinimum", "exclusiveMaximum"}
    if "if" in words:
        words |= {"then", "else"}
    if "dependentRequired" in words:  # 2019-09 and later
        words |= {"minContains", "maxContains"}
    return frozenset(words)


# The numeric bounds (multipleOf aside), as a backend may drop them quietly.
_NUMERIC_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_TYPES = ("null", "boolean", "object", "array", "string", "number")
_STRING_KEYWORDS = ("pattern", "format", "minLength", "maxLength")
# Where a subschema describes a value of its own (``_close_object`` may close it).
_VALUE_POSITIONS = frozenset(
    {"properties", "patternProperties", "additionalProperties", "items", "prefixItems"}
)
# Keywords beside which an object is not closed: what merges with it, or leaves it open.
_OPEN_KEYWORDS = (
    "additionalProperties", "patternProperties", "unevaluatedProperties", "allOf", "anyOf",
    "oneOf", "$ref", "not", "if", "dependentSchemas", "propertyNames",
)  # fmt: skip
# What not / if may test for llguidance (``schema_logic``).
_NEGATABLE = (
    "type, required, const, enum, allOf and properties of those, and a pattern of one "
    "repeated character class (and true / false)"
)
# xgrammar enforces multipleOf beside a range only while the range spans less than this
# (it lists the range's multiples; measured: 0..9999 enforced, 0..10000 dropped quietly).
_XGRAMMAR_MULTIPLE_OF_SPAN = 10_000
# dependentRequired / dependentSchemas entries rewritten per object: each doubles the
# branches the backend explores.
MAX_DEPENDENCIES = 6


@dataclass(frozen=True)
class CheckedSchema:
    """A schema as one backend must compile it.

    text: the schema in 2020-12 keywords, with what this backend enforces only.
    warnings: what a lenient read dropped, one line per keyword with its JSON pointer
        (empty unless the request asked for ``json_schema_lenient``).
    open_one_ofs: the JSON pointers of the oneOfs left to the backend to prove
        exclusive (``schema_facts`` could not).
    """

    text: str
    warnings: tuple[str, ...] = ()
    unique: str | None = None  # the schema with its uniqueItems (``unique_items``), if any
    open_one_ofs: tuple[str, ...] = ()


def check_schema(
    text: str,
    backend: str,
    max_depth: int,
    lenient: bool = False,
    bounded_numbers: bool = False,
    max_string_length: int | None = None,
) -> CheckedSchema:
    """The schema ``text`` as ``backend`` must compile it (module docstring); with
    ``bounded_numbers``, its numbers bounded where it leaves them open (``json_numbers``);
    with ``max_string_length``, its strings (``json_strings``).

    Raises:
        GrammarError: invalid JSON Schema, too deep, or accepting nothing.
        UnsupportedGrammarError: a keyword or format ``backend`` does not enforce (unless
            ``lenient``: then it is dropped and named in the warnings).
    """
    support = REGISTRY.json_schema(backend)
    schema = json.loads(text)
    drafts = _drafts()
    jsonschema = drafts.jsonschema
    draft = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    schema, repeats = _without_repeats(schema, draft)
    try:
        draft.check_schema(schema)
    except jsonschema.SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "(root)"
        raise GrammarError("json_schema", f"not a valid JSON Schema at {where}: {e.message}") from e
    vocabulary = drafts.vocabulary.get(draft, drafts.vocabulary[jsonschema.Draft202012Validator])
    schema = hoist_refs(schema)
    checks = _Checks(backend, support, lenient)
    checks.warnings += [f"{where} lists a value twice: read once" for where in repeats]
    rewriter = _Rewriter(checks, SchemaFacts(schema, vocabulary)) if support.rewrites else None
    out = _Reader(vocabulary, max_depth, checks, rewriter).read(schema, "#", 0)
    if rewriter is not None:
        _false_refs_inlined(out)
    if bounded_numbers or max_string_length is not None:
        out = bound_schema(out, backend, bounded_numbers, max_string_length)
    text = json.dumps(out, ensure_ascii=False)
    unique = None
    if f'"{_UNIQUE}"' in text:  # enforced around the backend's matcher
        unique = json.dumps(_unique_marks(out, keep=True), ensure_ascii=False)
        text = json.dumps(_unique_marks(out, keep=False), ensure_ascii=False)
    return CheckedSchema(text, tuple(checks.warnings), unique, tuple(checks.open_one_ofs))


@dataclass
class _Checks:
    """The per-keyword checks of one schema's read for one backend: what it does not
    enforce is refused by name, or (lenient) dropped with a warning collected here."""

    backend: str
    support: JsonSchemaSupport  # what the backend enforces (its registry entry)
    lenient: bool
    warnings: list[str] = field(default_factory=list)
    open_one_ofs: list[str] = field(default_factory=list)  # see CheckedSchema

    def refuse_unenforced(self, node: dict, path: str) -> None:
        meaningful = _drafts().any_draft
        unknown = sorted(k for k in node if k in meaningful and k not in self.support.keywords)
        if unknown:
            self.refuse(node, unknown, path, "")

    def check_format(self, node: dict, path: str) -> None:
        fmt = node.get("format")
        if fmt is None:
            return
        if fmt in FORMAT_SUBSETS and fmt in self.support.formats and self.support.rewrites:
            fmt = node["format"] = FORMAT_SUBSETS[fmt]  # a subset of its strings
        if fmt not in DEFINED_FORMATS:
            del node["format"]  # the author's annotation
        elif fmt in self.support.formats and fmt in FORMAT_PATTERNS and self.support.rewrites:
            if "pattern" in node:  # one regex per string: no intersection of two
                why = f"format {fmt!r} is enforced as a pattern, and one is already there"
                self.refuse(node, ["format"], path, why)
            else:
                node["pattern"] = FORMAT_PATTERNS[node.pop("format")]
        elif fmt in STRICTER_FORMATS and self.support.rewrites and "pattern" not in node:
            node["pattern"] = STRICTER_FORMATS[node.pop("format")]  # else the backend's own
        elif fmt not in self.support.formats:
            message = (
                f"format {fmt!r} at {path} is not enforced by the {self.backend} backend"
                f"{_elsewhere([fmt], self.backend, 'formats')} (enforced: "
                f"{', '.join(sorted(self.support.formats))})"
            )
            if not self.lenient:
                raise UnsupportedGrammarError(
                    "json_schema", f"{message}; or set json_schema_lenient=True"
                )
            del node["format"]
            self.warnings.append(f"dropped: {message}")

    def check_quiet_drops(self, node: dict, path: str) -> None:
        """What xgrammar 0.2.9 and outlines-core drop without a word (measured on
        JSONSchemaBench's schemas): string keywords on a node that does not say
        ``"type": "string"``, ``required`` beside ``anyOf``, and (xgrammar) ``multipleOf``
        on a number or beside a range, numeric bounds on a node of no type, and a regex's
        lookaround or anchor inside it (xgrammar reads ``^(a|b$)c`` as taking "bc")."""
        regexes = [("pattern", node["pattern"])] if isinstance(node.get("pattern"), str) else []
        regexes += [("patternProperties", key) for key in node.get("patternProperties", {})]
        for keyword, regex in regexes:
            if (dropped := assertion_inside(regex)) is not None:
                why = f"it would ignore {dropped} of {regex!r} (and take strings it refuses)"
                self.refuse(node, [keyword], path, why)
        strings = [k for k in _STRING_KEYWORDS if k in node]
        if strings and node.get("type") != "string":
            self.refuse(node, strings, path, 'enforced only beside "type": "string"')
        if "required" in node and "anyOf" in node:
            self.refuse(node, ["required"], path, "not enforced beside anyOf")
        if "multipleOf" in node and node.get("type") != "integer":
            self.refuse(node, ["multipleOf"], path, 'enforced only beside "type": "integer"')
        bounds = [k for k in _NUMERIC_BOUNDS if k in node]
        if "multipleOf" in node and bounds and _span(node) >= _XGRAMMAR_MULTIPLE_OF_SPAN:
            why = "not enforced beside a range open on one side or of over 10,000 integers"
            self.refuse(node, ["multipleOf"], path, why)
        if bounds and "type" not in node:
            self.refuse(node, bounds, path, 'enforced only beside "type": "integer" / "number"')

    def check_string_families(self, node: dict, path: str) -> None:
        """xgrammar and outlines enforce only one of pattern / format / length bounds on a
        string and drop the others (measured: xgrammar lets ``"abcdef"`` through
        ``pattern`` + ``maxLength: 3``; outlines ignores ``pattern`` beside ``maxLength``)."""
        families = [("pattern",), ("format",), ("minLength", "maxLength")]
        present = [f for f in families if any(k in node for k in f)]
        if len(present) <= 1:
            return
        names = ["/".join(f) for f in present]
        message = (
            f"{' and '.join(names)} together at {path}: the {self.backend} backend enforces "
            "only one of them on a string; fold the length into the pattern (e.g. "
            f"^[a-z]{{1,3}}$){_exact_strings(self.backend)}"
        )
        if not self.lenient:
            raise UnsupportedGrammarError("json_schema", message)
        for family in present[1:]:
            for key in family:
                node.pop(key, None)
        self.warnings.append(f"dropped {', '.join(names[1:])}: {message}")

    def refuse(self, node: dict, keywords: list[str], path: str, why: str) -> None:
        """Refuses ``keywords`` of ``node`` by name, or (lenient) drops them with a warning."""
        message = (
            f"keyword(s) {', '.join(keywords)} at {path} are not enforced by the {self.backend} "
            f"backend{': ' + why if why else ''}"
            f"{_elsewhere(keywords, self.backend, 'keywords')}"
        )
        if not self.lenient:
            raise UnsupportedGrammarError(
                "json_schema",
                f"{message}; remove them, express the constraint another way, or set "
                "json_schema_lenient=True to generate without them",
            )
        for key in keywords:
            node.pop(key, None)
            if key == "if":
                node.pop("then", None)
                node.pop("else", None)
        self.warnings.append(f"dropped: {message}")


@dataclass
class _Rewriter:
    """Rewrites the keywords a backend lacks into ones it enforces, each exactly (for a
    backend whose ``JsonSchemaSupport.rewrites``: llguidance)."""

    checks: _Checks  # refuses what cannot be rewritten
    facts: SchemaFacts  # what a subschema (its $refs followed) says of the values it takes

    def rewrite(self, node: dict, path: str) -> None:
        """dependentRequired / dependentSchemas, propertyNames, counted properties, not,
        oneOf told apart, and a pattern in syntax llguidance reads, in keywords llguidance
        enforces (each exact)."""
        if isinstance(node.get("pattern"), str):
            node["pattern"] = portable_pattern(node["pattern"])
        branches = self._dependencies(node, path)
        if "$ref" in node:  # llguidance refuses a recursive $ref with sibling keywords
            for note in NOTE_KEYWORDS & node.keys():
                del node[note]
        if "propertyNames" in node:
            self._property_names(node, path)
        _literal_patterns_declared(node)
        _declared_out_of_patterns(node, self.facts)
        branches += _counted_properties(node)
        counted = [k for k in ("minProperties", "maxProperties") if k in node]
        optional = set(node.get("properties", {})) - set(node.get("required", []))
        if counted and optional:  # llguidance counts only with every listed one required
            self.checks.refuse(node, counted, path, "not enforced beside optional properties")
        if "not" in node:
            negated = negation(self.facts.inlined(node["not"]))
            if negated is None:
                why = f"enforced only over {_NEGATABLE}"
                self.checks.refuse(node, ["not"], path, why)
            else:
                del node["not"]
                branches.append(negated)
        if "if" in node:
            branches += self._conditional(node, path)
        if "oneOf" in node:
            one_of = self._exclusive_by_required(node.pop("oneOf"), node)
            exclusive = exclusive_branches(self.facts, one_of, node)
            if exclusive is not None:  # exactly one <=> at least one
                branches.append({"anyOf": exclusive} if exclusive else False)
            else:  # llguidance may still prove it; else it refuses
                node["oneOf"] = one_of
                self.checks.open_one_ofs.append(path)
        if branches:
            node["allOf"] = [*node.get("allOf", []), *branches]
        self._drop_implied_type(node)

    def _drop_implied_type(self, node: dict) -> None:
        """``type`` beside an anyOf whose every member says it (an anyOf of references
        to objects beside ``type: object``): llguidance would intersect each member with
        it, which it cannot do through a recursive reference. The same values."""
        if "type" not in node or not isinstance(node.get("anyOf"), list) or not node["anyOf"]:
            return
        allowed = self.facts.types({"type": node["type"]})
        for member in node["anyOf"]:
            kinds = self.facts.types(member)
            if kinds is None or allowed is None or not kinds <= allowed:
                return
        del node["type"]

    def _conditional(self, node: dict, path: str) -> list:
        """if / then / else (popped) as one allOf branch (``schema_logic.conditional``)."""
        if_ = self.facts.inlined(node["if"])
        rewritten = conditional(if_, node.get("then", True), node.get("else", True))
        if rewritten is None:
            keywords = [k for k in ("if", "then", "else") if k in node]
            self.checks.refuse(node, keywords, path, f"if enforced only over {_NEGATABLE}")
            return []
        for key in ("if", "then", "else"):
            node.pop(key, None)
        return [rewritten]

    def mark_unique(self, node: dict) -> None:
        """uniqueItems marked for the guard (``unique_items``), which enforces it over
        items of every kind: kept for the guard, out of the backend's text."""
        if "uniqueItems" in node:
            node["uniqueItems"] = _UNIQUE

    def _dependencies(self, node: dict, path: str) -> list[dict]:
        """dependentRequired and dependentSchemas (popped) as allOf branches."""
        branches: list[dict] = []
        for name, needs in node.pop("dependentRequired", {}).items():
            # present(name) -> present(needs): name absent, or name and needs present
            branches.append(
                {"anyOf": [{"properties": {name: False}}, {"required": [name, *needs]}]}
            )
        for name, sub in node.pop("dependentSchemas", {}).items():
            present = {"required": [name], "allOf": [sub]}
            branches.append({"anyOf": [{"properties": {name: False}}, present]})
        if len(branches) > MAX_DEPENDENCIES:
            self.checks.refuse(
                node, ["dependentRequired"], path,
                f"more than {MAX_DEPENDENCIES} dependencies in one object",
            )  # fmt: skip
            return []
        return branches

    def _exclusive_by_required(self, branches: list, parent: dict) -> list:
        """oneOf branches told apart by which properties they require made provably so: a
        branch that does not require a property another one requires forbids it. This
        only narrows each branch to values the others refuse, so the oneOf stays exact."""
        out = [dict(b) if isinstance(b, dict) else b for b in branches]
        for i, branch in enumerate(out):
            if not isinstance(branch, dict):
                continue
            for j, other in enumerate(branches):
                if i == j or not isinstance(other, dict):
                    continue
                if self.facts.told_apart(branch, other, parent):
                    continue
                mine = self.facts.required(branch)
                theirs = [name for name in sorted(self.facts.required(other)) if name not in mine]
                if not theirs:
                    continue
                declared = branch.get("properties", {})
                name = next((n for n in theirs if n not in declared), theirs[0])
                branch["properties"] = {**declared, name: False}
        return out

    def names_as_pattern(self, node: dict) -> None:
        """Before ``node``'s subschemas are read (which rewrites their ``not`` and
        ``oneOf``): its propertyNames (a lone $ref followed) as the one pattern
        ``_names_regex`` finds, or dropped where it only says names are strings."""
        names = self.facts.resolved(node["propertyNames"])
        if not isinstance(names, dict) or names.get("type", "string") != "string":
            return
        if not set(names) - NOTE_KEYWORDS - {"type"}:
            del node["propertyNames"]
            return
        regex = _names_regex(names)
        if regex is not None:
            node["propertyNames"] = {"type": "string", "pattern": regex}

    def _property_names(self, node: dict, path: str) -> None:
        """propertyNames as patternProperties: the names' regex takes what
        additionalProperties allowed (or the one pattern property that takes every
        name), which becomes false; declared properties whose names fail it become
        false (a required one: the schema accepts nothing). A propertyNames that only
        says names are strings is dropped."""
        regex = _names_regex(node["propertyNames"])
        if regex is None:
            why = (
                "it is a pattern, an enum, a const, length bounds, not an enum, or "
                "anyOf / oneOf of those"
            )
            self.checks.refuse(node, ["propertyNames"], path, f"enforced only where {why}")
            return
        declared = node.get("properties", {})
        extra = node.get("additionalProperties", True)
        every = [p for p in node.get("patternProperties", {}) if _matches_every_name(p)]
        if every and len(node["patternProperties"]) == 1:
            # every name takes that pattern's schema: additionalProperties never applied,
            # and declared properties took it too, as they will take the regex's
            extra = node.pop("patternProperties")[every[0]]
            shared_by_declared = True
        else:
            shared_by_declared = False
        try:
            passing = [name for name in declared if re.search(regex, name)]
        except re.error as e:
            raise GrammarError("json_schema", f"propertyNames at {path}: bad pattern: {e}") from e
        constraining = extra not in (True, {})
        if "patternProperties" in node or (passing and constraining and not shared_by_declared):
            # a declared or pattern property would also take the regex's schema
            why = (
                "not enforced beside patternProperties (but one that takes every name), "
                "or beside declared properties and a constraining additionalProperties"
            )
            self.checks.refuse(node, ["propertyNames"], path, why)
            return
        del node["propertyNames"]
        for name in declared:
            if name not in passing:
                if name in node.get("required", []):
                    _accepts_nothing(path, f"required property {name!r} fails propertyNames")
                declared[name] = False
        node["patternProperties"] = {regex: extra}
        node["additionalProperties"] = False


@dataclass
class _Reader:
    """One schema's walk for one backend: each subschema (a copy) in 2020-12 keywords,
    then its keywords checked (``checks``) and, where the backend takes them, rewritten
    (``rewriter``)."""

    vocabulary: frozenset[str]  # the schema's draft's validation keywords
    max_depth: int
    checks: _Checks
    rewriter: _Rewriter | None  # None: the backend gets no rewrites

    def read(self, node: Any, path: str, depth: int, standalone: bool = True) -> Any:
        """``node`` (a subschema at ``path``) in 2020-12 keywords for the backend.
        ``standalone``: it describes a value of its own (the root, a property's, an item's),
        not one it shares with sibling subschemas (allOf / anyOf / oneOf branches,
        definitions a $ref may merge, not / if / then / else)."""
        if not isinstance(node, dict):
            return node  # true / false
        if depth > self.max_depth:
            raise GrammarError(
                "json_schema", f"nested deeper than {self.max_depth} levels at {path}"
            )
        out = self._in_2020_12(node)
        _drop_no_ops(out)
        self.checks.refuse_unenforced(out, path)  # this node's own first, then its subschemas
        if self.rewriter is not None:
            self.rewriter.mark_unique(out)
        if self.rewriter is not None and isinstance(out.get("allOf"), list):
            table = discriminator_table(out["allOf"])
            if table is not None:  # read as one: n + 2 branches, not 2^n
                rest, rewritten = table
                out["allOf"] = [*rest, rewritten]
        if self.rewriter is not None and "propertyNames" in out:
            self.rewriter.names_as_pattern(out)
        self._read_subschemas(out, path, depth)
        if self.rewriter is not None:
            if standalone:
                _close_object(out)
            self.rewriter.rewrite(out, path)
        self.checks.check_format(out, path)
        if self.checks.support.quiet_drops:
            self.checks.check_quiet_drops(out, path)
            self.checks.check_string_families(out, path)
        killed = _contradicted_kinds(out)
        if not killed:
            return out
        why = "; ".join(dict.fromkeys(killed.values()))
        declared = out.get("type", list(_TYPES))
        declared = [declared] if isinstance(declared, str) else declared
        left = [t for t in declared if _KIND.get(t, t) not in killed]
        if left:  # only those types' keywords contradict: the others' values remain
            out["type"] = left[0] if len(left) == 1 else left
            return out
        if self.rewriter is None or path == "#":
            _accepts_nothing(path, why)
        # llguidance reads false: the value may not be there (none if it must be)
        self.checks.warnings.append(f"the subschema at {path} accepts nothing: {why}")
        return False

    def _read_subschemas(self, out: dict, path: str, depth: int) -> None:
        for key in list(out):
            value = out[key]
            if key == "propertyNames" and isinstance(value, dict) and "type" not in value:
                value = {"type": "string", **value}  # names are strings: say so
            own = key in _VALUE_POSITIONS
            if key in ONE_SCHEMA_KEYWORDS:
                out[key] = self.read(value, f"{path}/{key}", depth + 1, own)
            elif key in SCHEMA_LIST_KEYWORDS and isinstance(value, list):
                out[key] = [
                    self.read(v, f"{path}/{key}/{i}", depth + 1, own) for i, v in enumerate(value)
                ]
            elif key in SCHEMA_DICT_KEYWORDS and isinstance(value, dict):
                out[key] = {
                    name: self.read(v, f"{path}/{key}/{pointer_token(name)}", depth + 1, own)
                    for name, v in value.items()
                }

    def _in_2020_12(self, node: dict) -> dict:
        """A copy of ``node`` without this draft's annotations that are keywords in another
        draft, and with an older draft's keywords of changed meaning rewritten: draft-04's
        boolean exclusiveMinimum / exclusiveMaximum become bounds, array-form items (up to
        2019-09) becomes prefixItems with additionalItems as items, dependencies (up to
        draft-07) becomes dependentRequired / dependentSchemas."""
        meaningful = _drafts().any_draft
        out = {k: v for k, v in node.items() if k not in meaningful or k in self.vocabulary}
        if "$ref" in out and "dependentRequired" not in self.vocabulary:
            # up to draft-07 a $ref's sibling keywords are ignored (definitions stay)
            kept = {"$ref", *_CONTAINERS}
            out = {k: v for k, v in out.items() if k in kept or k not in self.vocabulary}
        if "prefixItems" not in self.vocabulary:  # up to 2019-09
            extra = out.pop("additionalItems", None)
            if isinstance(out.get("items"), list):  # a tuple: its positions, then the rest
                out["prefixItems"] = out.pop("items")
                if extra is not None:
                    out["items"] = extra
        for exclusive, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
            flag = out.get(exclusive)
            if isinstance(flag, bool):  # draft-04: a flag on the plain bound
                del out[exclusive]
                if flag and bound in out:
                    out[exclusive] = out.pop(bound)
        dependencies = out.pop("dependencies", None)
        if isinstance(dependencies, dict):
            for name, value in dependencies.items():
                kind = "dependentRequired" if isinstance(value, list) else "dependentSchemas"
                out.setdefault(kind, {})[name] = value
        return out


# What the read leaves as uniqueItems where the guard (``unique_items``) enforces it:
# ``_unique_marks`` makes it true for the guard's copy and takes it out of the backend's.
_UNIQUE = "radixlm-unique-items"


def _unique_marks(schema: Any, keep: bool) -> Any:
    """A copy of ``schema`` with each guard-enforced uniqueItems true (``keep``) or gone."""
    if isinstance(schema, dict):
        out = {}
        for key, value in schema.items():
            if key == "uniqueItems" and value == _UNIQUE:
                if keep:
                    out[key] = True
            elif key in ("enum", "const", "default", "examples"):
                out[key] = value
            else:
                out[key] = _unique_marks(value, keep)
        return out
    if isinstance(schema, list):
        return [_unique_marks(v, keep) for v in schema]
    return schema


def _literal_patterns_declared(node: dict) -> None:
    """A pattern property of one name (``^_execute_browser_action$``) that another
    pattern also matches becomes a declared property (merged into one of that name):
    the same values, as every pattern matching a name applies to it declared or not;
    llguidance refuses pattern properties whose patterns overlap."""
    patterns = node.get("patternProperties")
    if not isinstance(patterns, dict) or len(patterns) < 2:
        return
    for pattern in list(patterns):
        name = pattern_literal(pattern)
        others = [p for p in patterns if p != pattern]
        try:
            overlapping = name is not None and any(re.search(p, name) for p in others)
        except re.error:
            continue
        if overlapping:
            declared = node.setdefault("properties", {})
            sub = patterns.pop(pattern)
            declared[name] = {"allOf": [declared[name], sub]} if name in declared else sub


def _declared_out_of_patterns(node: dict, facts: SchemaFacts) -> None:
    """A pattern property whose pattern matches every name (``.*``, ``^[a-z]*``) stops
    matching the declared properties, whose schemas take its schema in instead (none to
    take where they are the same, annotations aside, or where the declared one implies
    it): llguidance intersects a declared property's schema with each matching pattern's,
    and cannot where they reach a recursive $ref, though the two say the same."""
    declared, patterns = node.get("properties"), node.get("patternProperties")
    if not isinstance(declared, dict) or not declared or not isinstance(patterns, dict):
        return
    for pattern, sub in list(patterns.items()):
        if not _matches_every_name(pattern):
            continue
        for name, schema in declared.items():
            if sub is True or sub == {} or _without_notes(schema) == _without_notes(sub):
                continue
            if not facts.implies(schema, sub):
                declared[name] = {"allOf": [schema, sub]}
        del patterns[pattern]
        others = complement_regex(sorted(declared))
        patterns[others] = {"allOf": [patterns[others], sub]} if others in patterns else sub


def _matches_every_name(pattern: str) -> bool:
    """Whether the regex ``pattern`` (searched, as JSON Schema does) matches every string:
    what follows an optional ^ matches the empty string, with no anchor or lookaround."""
    rest = pattern[1:] if pattern.startswith("^") else pattern
    if re.search(r"\\[bBAzZ]|\$|\(\?", rest):
        return False
    try:
        return re.fullmatch(rest, "") is not None
    except re.error:
        return False


def _without_notes(schema: Any) -> Any:
    """``schema`` without its annotations, at every level, for comparing two."""
    if isinstance(schema, dict):
        return {k: _without_notes(v) for k, v in schema.items() if k not in NOTE_KEYWORDS}
    if isinstance(schema, list):
        return [_without_notes(v) for v in schema]
    return schema


def _drop_no_ops(node: dict) -> None:
    """Keywords whose value constrains nothing (so no backend need enforce them)."""
    if node.get("uniqueItems") is False or ("uniqueItems" in node and node.get("maxItems", 2) <= 1):
        del node["uniqueItems"]
    if "if" not in node:  # then / else apply only beside if
        node.pop("then", None)
        node.pop("else", None)
    elif "then" not in node and "else" not in node:
        del node["if"]
    if "contains" not in node:
        node.pop("minContains", None)
        node.pop("maxContains", None)
    for key in ("allOf", "anyOf", "oneOf"):
        if node.get(key) == []:  # invalid in every draft's meta-schema; never reached
            del node[key]
    for key in ("dependentRequired", "dependentSchemas", "propertyNames"):
        if node.get(key) in ({}, True):
            del node[key]


def _close_object(node: dict) -> None:
    """An object that lists its properties and says nothing of others gets
    ``additionalProperties: false``, as xgrammar's strict mode and OpenAI's structured
    outputs read it: every output stays valid, and a model no longer wanders into keys
    of its own (measured: the default model's greedy ``{"name": ..., "is_capital": ...}``
    ran on into invented keys until max_new_tokens). Only where nothing merges with the
    node (no allOf / anyOf / oneOf / $ref / not / if beside it, not itself a branch or
    a definition) and every required or counted property is listed."""
    declared = node.get("properties")
    if not declared or any(k in node for k in _OPEN_KEYWORDS):
        return
    if set(node.get("required", [])) - set(declared):
        return
    if node.get("minProperties", 0) > len(declared):
        return
    node["additionalProperties"] = False


def _counted_properties(node: dict) -> list[dict]:
    """minProperties / maxProperties that the node's other keywords already satisfy are
    removed, and where no property may be added beside the listed ones, "at least m of
    them" becomes an anyOf over which m are present (each required) and "at most M" one
    over which M may be (the others false), up to ``MAX_COUNTED_BRANCHES`` branches:
    what llguidance can then enforce (it counts properties only when every listed one
    is required)."""
    declared = node.get("properties", {})
    closed = node.get("additionalProperties") is False and "patternProperties" not in node
    required = set(node.get("required", []))
    guaranteed = len(required)
    alternatives = node.get("anyOf")
    if isinstance(alternatives, list) and all(isinstance(b, dict) for b in alternatives):
        guaranteed = min(len(required | set(b.get("required", []))) for b in alternatives)
    if node.get("minProperties", 0) <= guaranteed:
        node.pop("minProperties", None)
    if closed and node.get("maxProperties", len(declared)) >= len(declared):
        node.pop("maxProperties", None)
    if not closed or not isinstance(declared, dict):
        return []
    names = sorted(declared)
    optional = [name for name in names if name not in required]
    at_least = _picks(optional, node.get("minProperties"), len(required))
    at_most = _picks(optional, node.get("maxProperties"), len(required))
    if at_least and at_most and len(at_least) * len(at_most) > MAX_COUNTED_BRANCHES:
        return []  # read together, too many branches: left (and refused) as they are
    out: list[dict] = []
    if at_least:  # at least m of them: these present
        del node["minProperties"]
        out.append({"anyOf": [{"required": list(pick)} for pick in at_least]})
    if at_most:  # at most M of them: the others absent
        del node["maxProperties"]
        out.append({"anyOf": [
            {"properties": {name: False for name in optional if name not in pick}}
            for pick in at_most
        ]})  # fmt: skip
    return out


def _picks(optional: list[str], count: Any, required: int) -> list[tuple[str, ...]]:
    """The ways to pick ``count`` properties in all, beside ``required`` required ones,
    from ``optional`` (at most ``MAX_COUNTED_BRANCHES``; none where there are more, or
    ``count`` is not a count the required ones leave room for)."""
    if not isinstance(count, int) or isinstance(count, bool) or count < required:
        return []
    picks = itertools.combinations(optional, count - required)
    found = list(itertools.islice(picks, MAX_COUNTED_BRANCHES + 1))
    return found if len(found) <= MAX_COUNTED_BRANCHES else []


def _names_regex(names: Any) -> str | None:
    """A regex (searched) for the property names a propertyNames schema allows, for the
    forms that have one (a pattern, an enum, a const, length bounds, not an enum, anyOf
    of those, oneOf of enums); None otherwise."""
    if not isinstance(names, dict):
        return None
    keys = set(names) - NOTE_KEYWORDS - {"type"}
    if names.get("type", "string") != "string":
        return None
    if keys == {"pattern"}:
        return names["pattern"]
    strings = _name_values(names)
    if strings is not None:
        return "^(" + "|".join(re.escape(v) for v in strings) + ")$"
    if keys and keys <= {"minLength", "maxLength"}:
        return f"^.{{{names.get('minLength', 0)},{names.get('maxLength', '')}}}$"
    if keys == {"not"}:
        refused = _name_values(names["not"]) if isinstance(names["not"], dict) else None
        return complement_regex(refused) if refused is not None else None
    if keys == {"anyOf"} and isinstance(names["anyOf"], list) and names["anyOf"]:
        parts = [_names_regex(member) for member in names["anyOf"]]
        return None if None in parts else "|".join(f"(?:{part})" for part in parts)
    if keys == {"oneOf"} and isinstance(names["oneOf"], list) and names["oneOf"]:
        members = [_name_values(m) if isinstance(m, dict) else None for m in names["oneOf"]]
        if None in members:
            return None
        counts: dict[str, int] = {}
        for values in members:
            for value in dict.fromkeys(values):
                counts[value] = counts.get(value, 0) + 1
        once = [value for value, n in counts.items() if n == 1]  # in exactly one branch
        return "^(" + "|".join(re.escape(v) for v in once) + ")$" if once else None
    return None


def _name_values(names: dict) -> list[str] | None:
    """The names an enum / const (and at most a string type) allows, else None."""
    keys = set(names) - NOTE_KEYWORDS - {"type"}
    if names.get("type", "string") != "string" or keys not in ({"enum"}, {"const"}):
        return None
    values = names["enum"] if "enum" in names else [names["const"]]
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        return None
    return values


def _elsewhere(names: list[str], backend: str, table: str) -> str:
    """Names the first other backend (the JSON schema default first) whose ``table``
    ("keywords" or "formats") holds all of ``names``; '' if none does."""
    for other in REGISTRY.compiling("json_schema"):
        if other != backend and set(names) <= getattr(REGISTRY.json_schema(other), table):
            return f" (the {other} backend enforces them: grammar_backend={other!r})"
    return ""


def _exact_strings(backend: str) -> str:
    """Names the first other backend that enforces string keywords together."""
    for other in REGISTRY.compiling("json_schema"):
        if other != backend and not REGISTRY.json_schema(other).quiet_drops:
            return f", or use grammar_backend={other!r}"
    return ""


_BOUNDS = (
    ("minimum", "maximum"),
    ("minLength", "maxLength"),
    ("minItems", "maxItems"),
    ("minProperties", "maxProperties"),
)


def _span(node: dict) -> float:
    """How far a node's numeric range reaches (inf where it is open on a side)."""
    lower = max(node.get("minimum", -float("inf")), node.get("exclusiveMinimum", -float("inf")))
    upper = min(node.get("maximum", float("inf")), node.get("exclusiveMaximum", float("inf")))
    return upper - lower


# A type's kind, as _contradicted_kinds names it (an integer is a number).
_KIND = {"integer": "number"}
# Each pair of bounds' JSON type (its keywords constrain values of that type only).
_BOUND_KIND = {"minimum": "number", "minLength": "string", "minItems": "array",
               "minProperties": "object"}  # fmt: skip


def _false_refs_inlined(schema: Any) -> None:
    """Each ``$ref`` (with nothing beside it) to a definition the read left ``false``
    becomes ``false`` itself: llguidance refuses a reference to false ("unsatisfiable")
    even where false means only "not there" (a property's value, a pattern property's),
    as it reads a false written in place."""
    if not isinstance(schema, dict):
        return
    false: set[str] = set()
    changed = True
    while changed:  # a definition that is a reference to a false one is false too
        changed = False
        for container in _CONTAINERS:
            for name, sub in (schema.get(container) or {}).items():
                ref = f"#/{container}/{pointer_token(name)}"
                if ref not in false and _is_false(sub, false):
                    false.add(ref)
                    changed = True
    if false:
        _replace_refs(schema, false)


def _is_false(sub: Any, false: set[str]) -> bool:
    """Whether the read subschema ``sub`` takes no value: false, a reference to one of
    ``false``, an allOf holding such, an anyOf of nothing else."""
    if sub is False or _refers_to(sub, false):
        return True
    if not isinstance(sub, dict):
        return False
    members = sub.get("allOf")
    if isinstance(members, list) and any(_is_false(m, false) for m in members):
        return True
    branches = sub.get("anyOf")
    return isinstance(branches, list) and all(_is_false(b, false) for b in branches)


def _refers_to(sub: Any, targets: set[str]) -> bool:
    """Whether ``sub`` is a lone reference (annotations aside) to one of ``targets``."""
    return (
        isinstance(sub, dict)
        and sub.get("$ref") in targets
        and not set(sub) - NOTE_KEYWORDS - {"$ref"}
    )


def _replace_refs(node: Any, targets: set[str]) -> None:
    """Every lone reference to one of ``targets`` below ``node`` replaced by false."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("enum", "const", "default", "examples"):
                continue
            if _refers_to(value, targets):
                node[key] = False
            else:
                _replace_refs(value, targets)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            if _refers_to(value, targets):
                node[i] = False
            else:
                _replace_refs(value, targets)


def _without_repeats(schema: Any, draft: Any) -> tuple[Any, list[str]]:
    """``schema`` with the lists its draft wants unique (enum, required, type) that
    repeat a value listed once each (the same schema), and where they were; the schema
    itself where none does. Other errors are left to ``check_schema``."""
    places = [
        error.absolute_path
        for error in draft(draft.META_SCHEMA).iter_errors(schema)
        if error.validator == "uniqueItems" and isinstance(error.instance, list)
    ]
    if not places:
        return schema, []
    schema = json.loads(json.dumps(schema))  # a copy: the caller's stays as it was
    for place in places:
        *parents, last = place
        node = functools.reduce(lambda n, key: n[key], parents, schema)
        values: list[Any] = []
        for value in node[last]:
            if not any(_equal_json(value, seen) for seen in values):
                values.append(value)
        node[last] = values
    return schema, ["#/" + "/".join(pointer_token(str(p)) for p in place) for place in places]


def _equal_json(a: Any, b: Any) -> bool:
    """JSON Schema's equality: 1 and 1.0 equal, true and 1 not."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True) or (
        type(a) in (int, float) and type(b) in (int, float) and a == b
    )


def _contradicted_kinds(node: dict) -> dict[str, str]:
    """The JSON types (``_TYPES``) whose values a schema refuses all of by contradicting
    itself in one node (``minimum > maximum`` refuses every number, and only numbers),
    each with why; an empty enum refuses every type."""
    killed: dict[str, str] = {}
    for low, high in _BOUNDS:
        if low in node and high in node and node[low] > node[high]:
            killed[_BOUND_KIND[low]] = f"{low} {node[low]} > {high} {node[high]}"
    lower = max(node.get("minimum", -float("inf")), node.get("exclusiveMinimum", -float("inf")))
    upper = min(node.get("maximum", float("inf")), node.get("exclusiveMaximum", float("inf")))
    exclusive = "exclusiveMinimum" in node or "exclusiveMaximum" in node
    if lower > upper or (exclusive and lower == upper):
        killed.setdefault("number", "the numeric range is empty")
    if node.get("enum") == []:
        killed.update({kind: "enum is empty" for kind in _TYPES})
    if node.get("additionalProperties") is False:
        missing = sorted(set(node.get("required", [])) - set(node.get("properties", {})))
        if missing and "patternProperties" not in node:
            killed["object"] = (
                f"required {missing} are not in properties and additionalProperties is false"
            )
    return killed


def _accepts_nothing(path: str, why: str) -> None:
    raise GrammarError("json_schema", f"the schema accepts nothing at {path}: {why}")
