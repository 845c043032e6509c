"""Bounded JSON numbers: what a number may be in JSON mode where the schema does not say.

A grammar left to itself lets a JSON integer run to any length, and greedy decoding on
a small model does (``"population": 1111111111...`` until max_new_tokens); no JSON
parser keeps such a number exactly. So by default (``GrammarConfig.json_bounded_numbers``,
per request ``SamplingParams.json_bounded_numbers``) every JSON schema and every schema
in a structural tag is compiled with these bounds::

    integer   -9007199254740991 .. 9007199254740991          (+-(2^53 - 1))
    number    the same range, at most 6 digits after the      -12.5, 3.141593,
              point, no exponent                              9007199254740990.999999

Why these: +-(2^53 - 1) is I-JSON's range (RFC 7493 2.2), the integers an IEEE double
(JavaScript's Number, Python's float, most parsers' numbers) holds exactly; past it
9007199254740993 reads back as ...992. A number gets the same range, so an integral one
is kept as exactly as an integer. Its 6 fraction digits are what xgrammar allows in any
number that has a bound (its float-range grammar; 7 are refused, measured) and what
llguidance is given through ``multipleOf: 1e-6`` (the same acceptance on every probe of
the tests), so a schema means the same language on every backend; neither allows an
exponent in a bounded number. The longest number is 24 characters; 0.000001 is the
smallest step, and a double keeps 15-17 significant digits, so a parser rounds a long
one to the nearest double (relative error under 1.2e-16), as a float field does anyway.

A side (lower or upper) the schema bounds itself keeps its own bound, and a side whose
default would contradict the schema's other bound (``minimum: 1e17``) stays open: the
schema asks for numbers beyond these (llguidance and xgrammar read a schema's bounds up
to 1e18; past it llguidance refuses the range and xgrammar misreads it, measured). One
place per backend (its registry entry's ``JsonSchemaSupport.numbers`` says which, and
how it reads what is added)::

    llguidance, xgrammar   bound_schema: the checked schema rewritten (they enforce
                           minimum / maximum on numbers exactly, llguidance multipleOf)
    outlines               bound_regex: outlines-core ignores minimum / maximum, so the
                           number fragments of its regex are replaced by exact ones

``bound_schema`` bounds every integer / number subschema (properties, items,
prefixItems, additional and pattern properties, anyOf / oneOf / allOf branches,
$defs), never one under ``not`` / ``if`` / ``contains`` / ``propertyNames`` (bounding a
negated schema widens what it allows). Any JSON value (``{}``, ``true``, a subschema of
annotations only) becomes a reference to a bounded JSON value (a recursive ``$defs``
entry), and so do the values a schema leaves open where the backend leaves them open: an
object's additional properties (``{"type": "object"}``, json_object) and an array's items.

Strings (``json_max_string_length``, off by default) ride on the same walk: with it set,
``bound_schema`` also gives each string the schema leaves unbounded a ``maxLength``
(``json_strings.string_bound``), and puts the bounded JSON value even where numbers are
left open, its strings bounded too; outlines' regex: ``json_strings.bound_string_regex``.

Where the bounds do not reach (each kept so that nothing the schema says is lost):
  - below allOf / oneOf, an anyOf / $ref with keywords beside it, or a declared
    property a pattern property matches (and that pattern's schema), no bounded JSON
    value is put (``bound_schema``); integers and numbers there are bounded, and meet
    the other branches' bounds;
  - xgrammar: an integer with its own multipleOf keeps it and no range (xgrammar drops
    multipleOf beside a range of over 10,000 integers, measured);
  - outlines: free-form values (``{"type": "object"}``, ``{}``) spell numbers dozens of
    times in outlines-core's regex, whose FSM then takes past the default
    grammar_compile_timeout to build, unbounded or bounded (measured; see
    benchmarks/README.md): llguidance and xgrammar compile them quickly.
"""

from __future__ import annotations

import copy
import functools
import re
from typing import Any

from radixlm.runtime.constrained.json_strings import string_bound
from radixlm.runtime.constrained.registry import REGISTRY, JsonSchemaSupport, SchemaNumbers
from radixlm.runtime.errors import UnsupportedGrammarError

__all__ = ["MAX_SAFE_INTEGER", "FRACTION_DIGITS", "bound_schema", "bound_regex"]

MAX_SAFE_INTEGER = 2**53 - 1
FRACTION_DIGITS = 6
# llguidance bounds a number's fraction digits by multipleOf (xgrammar by itself).
_FRACTION_STEP = 10.0**-FRACTION_DIGITS

# A node holding one of these shares its value with other subschemas: nothing is added
# to it (its own subschemas decide).
_MERGING = frozenset({"allOf", "anyOf", "oneOf", "$ref", "$dynamicRef", "not", "if"})
# Subschemas llguidance intersects with one another (allOf, and oneOf, not, if as its
# rewrites read them), and an anyOf's or a $ref's with the keywords beside it.
_ALWAYS_MERGED = frozenset({"allOf", "oneOf", "not", "if", "dependentSchemas"})
_UNIONS = frozenset({"anyOf", "$ref", "$dynamicRef"})
# The subschemas walked: keyword -> (its shape, whether each describes a value of its own
# (a bare "any" there becomes the bounded JSON value) or shares its parent's, allOf-like).
_SUBSCHEMAS = {
    "items": ("one", True),
    "additionalProperties": ("one", True),
    "prefixItems": ("list", True),
    "anyOf": ("list", True),
    "allOf": ("list", False),
    "oneOf": ("list", False),
    "properties": ("dict", True),
    "patternProperties": ("dict", True),
    "$defs": ("dict", True),
    "definitions": ("dict", True),
    "dependentSchemas": ("dict", False),
}
_XGRAMMAR_CLOSES_OBJECT = frozenset({"properties", "patternProperties", "required"})
_DEF_NAME = "radixlm_bounded_json_value"


def bound_schema(
    schema: Any, backend: str, numbers: bool = True, max_string_length: int | None = None
) -> Any:
    """``schema`` (check_schema's read, 2020-12 keywords) with the default bounds (module
    docstring) as ``backend`` enforces them: on numbers where ``numbers``, on strings
    where ``max_string_length`` is set; unchanged for a backend that bounds its values
    elsewhere (outlines: ``bound_regex``, ``json_strings.bound_string_regex``).

    The bounded JSON value is recursive, and llguidance cannot intersect two recursive
    schemas ("Schema intersection stack level exceeded", measured): so it is never put
    where subschemas merge (below allOf / oneOf, an anyOf / $ref with keywords beside
    it, a declared property and a pattern property that matches its name), nor in a
    $defs entry a $ref reaches from there: a fixed point over those.
    """
    support = REGISTRY.json_schema(backend)
    if support.numbers is None or not isinstance(schema, dict):
        return schema
    if not numbers and max_string_length is None:
        return schema
    bounds = _Bounds(support, numbers, max_string_length)
    name = _unused_name(schema.get("$defs", {}))
    merged: frozenset[str] = frozenset()
    while True:
        bounder = _Bounder(bounds, name, _root_uri(schema), merged)
        out = bounder.walk(copy.deepcopy(schema))
        if bounder.found <= merged:
            return out
        merged |= bounder.found


class _Bounds:
    """What one ``bound_schema`` call adds: number bounds (``numbers``), string bounds
    (``max_string_length``, None: none), as the backend (``support``) reads them."""

    def __init__(self, support: JsonSchemaSupport, numbers: bool, max_string_length: int | None):
        assert support.numbers is not None
        self.support = support
        self.reading: SchemaNumbers = support.numbers
        self.numbers = numbers
        self.max_string_length = max_string_length


class _Bounder:
    """One walk over a schema. ``bounds``: what is added, and how the backend reads it;
    ``merged``: the JSON pointers of subschemas that merge with others (the $ref targets
    met where subschemas merge); ``found``: those this walk met; ``used``: whether the
    bounded JSON value is referenced."""

    def __init__(self, bounds: _Bounds, name: str, root_uri: str, merged: frozenset[str]):
        self.bounds = bounds
        self.reading = bounds.reading
        self.name = name  # the bounded JSON value's $defs entry
        self.target = f"{root_uri}#/$defs/{name}"  # and a reference to it from anywhere
        self.merged = merged
        self.found: set[str] = set()
        self.used = False

    def walk(self, schema: dict) -> dict:
        if _is_any(schema) and "#" not in self.merged:
            schema.update(self.any_value())  # the root: beside what it holds ($defs, notes)
        else:
            self.bound(schema, "#", own=True, merged=False)
        if self.used:
            schema.setdefault("$defs", {})[self.name] = self.any_value()
        return schema

    def ref(self) -> dict:
        self.used = True
        return {"$ref": self.target}

    def any_value(self) -> dict:
        """A JSON value whose numbers (and strings, with a string bound), at any depth,
        are bounded. Its object keys are not: a key is a property name, and keys of
        free-form objects are left as the backend spells them (docs/constrained.md)."""
        if self.bounds.max_string_length is None:
            scalars = [{"type": ["null", "boolean", "string"]}]
        else:  # xgrammar applies maxLength only beside "type": "string" (measured)
            scalars = [{"type": ["null", "boolean"]}, self._string({"type": "string"})]
        return {
            "anyOf": [
                *scalars,
                self._bounded({"type": "number"}),
                {"type": "array", "items": self.ref()},
                {"type": "object", "additionalProperties": self.ref()},
            ]
        }

    def bound(self, node: Any, path: str, own: bool, merged: bool) -> Any:
        """``node`` (at ``path``) bounded; a bare "any" in a position of its own
        (``own``) becomes the bounded JSON value, except where subschemas merge."""
        merged = merged or path in self.merged
        if _is_any(node):
            return self.ref() if own and not merged else node
        if not isinstance(node, dict):
            return node  # false
        merges = bool(node.keys() & _ALWAYS_MERGED) or bool(
            node.keys() & _UNIONS and node.keys() & (_constraining() - _UNIONS)
        )
        if (merged or merges) and isinstance(node.get("$ref"), str):
            self.found.add(node["$ref"])
        self._bound_subschemas(node, path, merged or merges)
        if "enum" in node or "const" in node:
            return node
        types = _types(node)
        if types is None and not merged and self._bounds_untyped(node):
            self._bounded(node)
            self._string(node)
        elif types is not None:
            if types & {"integer", "number"}:
                self._bounded(node)
            if "string" in types:
                self._string(node)
        if not merged:
            self._bound_open_values(node)
        return node

    def _bound_subschemas(self, node: dict, path: str, merged: bool) -> None:
        shared = _shared_names(node)
        for key, (shape, own) in _SUBSCHEMAS.items():
            value, at = node.get(key), f"{path}/{key}"
            if key in node and shape == "one":
                node[key] = self.bound(value, at, own, merged)
            elif shape == "list" and isinstance(value, list):
                node[key] = [self.bound(v, f"{at}/{i}", own, merged) for i, v in enumerate(value)]
            elif shape == "dict" and isinstance(value, dict):
                node[key] = {
                    name: self.bound(
                        v, f"{at}/{_escape(name)}", own, merged or (key, name) in shared
                    )
                    for name, v in value.items()
                }

    def _bounds_untyped(self, node: dict) -> bool:
        """Whether a node of no type gets the bounds (numbers are among its values):
        llguidance applies numeric keywords beside no type to numbers only; xgrammar
        drops them (measured), and reads such a node's type from its other keywords."""
        return self.reading.untyped_numeric_keywords and not node.keys() & _MERGING

    def _string(self, node: dict) -> dict:
        """Adds ``maxLength`` where the string bound applies (``json_strings``)."""
        limit = self.bounds.max_string_length
        if limit is not None:
            bound = string_bound(node, limit, self.bounds.support)
            if bound is not None:
                node["maxLength"] = bound
        return node

    def _bounded(self, node: dict) -> dict:
        """Adds the default bound on each side the node leaves open (module docstring)."""
        if not self.bounds.numbers:
            return node
        if not self.reading.multiple_of_beside_range and "multipleOf" in node:
            return node  # xgrammar drops multipleOf beside a range (measured): it wins
        types = _types(node)
        low = max(node.get("minimum", -float("inf")), node.get("exclusiveMinimum", -float("inf")))
        high = min(node.get("maximum", float("inf")), node.get("exclusiveMaximum", float("inf")))
        if low == -float("inf") and high >= -MAX_SAFE_INTEGER:
            node["minimum"] = -MAX_SAFE_INTEGER
        if high == float("inf") and low <= MAX_SAFE_INTEGER:
            node["maximum"] = MAX_SAFE_INTEGER
        is_number = types is None or "number" in types
        if is_number and self.reading.fraction_by_multiple_of and "multipleOf" not in node:
            node["multipleOf"] = _FRACTION_STEP
        return node

    def _bound_open_values(self, node: dict) -> None:
        """The bounded JSON value for the additional properties and items the node leaves
        open as the backend reads it (nothing beside keywords that merge subschemas)."""
        if node.keys() & _MERGING:
            return
        types = _types(node)
        if not self.reading.closes_listed_objects:  # llguidance
            # Open unless said (objects that list their properties are closed already);
            # a node of no type may be an object or an array.
            kinds = {"object", "array"} if types is None else types
            opens_object, opens_array = "object" in kinds, "array" in kinds
        else:  # xgrammar
            # xgrammar reads an untyped node's type from its keywords (one added may
            # change it), and in strict mode closes an object that lists properties and
            # an array with prefixItems (measured).
            kinds = types or set()
            opens_object = "object" in kinds and not node.keys() & _XGRAMMAR_CLOSES_OBJECT
            opens_array = "array" in kinds and "prefixItems" not in node
        if opens_object:
            node.setdefault("additionalProperties", self.ref())
        if opens_array:
            node.setdefault("items", self.ref())


def _shared_names(node: dict) -> set[tuple[str, str]]:
    """("properties", name) and ("patternProperties", pattern) of a declared property
    whose name a pattern property matches, and of that pattern: the backend intersects
    their schemas (subschemas that merge)."""
    declared, patterns = node.get("properties"), node.get("patternProperties")
    if not isinstance(declared, dict) or not isinstance(patterns, dict):
        return set()
    shared: set[tuple[str, str]] = set()
    for pattern in patterns:
        try:
            matched = [name for name in declared if re.search(pattern, name)]
        except re.error:  # a pattern Python cannot read: say every name may match
            matched = list(declared)
        if matched:
            shared.add(("patternProperties", pattern))
            shared.update(("properties", name) for name in matched)
    return shared


def _types(node: dict) -> set[str] | None:
    kind = node.get("type")
    if kind is None:
        return None
    return {kind} if isinstance(kind, str) else set(kind)


def _is_any(node: Any) -> bool:
    """Whether the subschema allows every JSON value (true, {}, annotations only)."""
    return node is True or (isinstance(node, dict) and not node.keys() & _constraining())


def _escape(name: str) -> str:
    """A property name as a JSON pointer token (RFC 6901)."""
    return name.replace("~", "~0").replace("/", "~1")


def _root_uri(schema: dict) -> str:
    """The root's own URI (its ``$id``, draft-04's ``id``, fragment dropped) where a
    subschema has an id of its own (a reference to the root's ``$defs`` from within it
    would otherwise resolve against that one), else "" (a plain ``#/...``)."""
    uri = next((schema[k] for k in ("$id", "id") if isinstance(schema.get(k), str)), "")
    if not uri or not _holds_id(schema, root=True):
        return ""
    return uri.partition("#")[0]


def _holds_id(node: Any, root: bool = False) -> bool:
    """Whether a subschema below ``node`` (``node`` itself unless ``root``) has an id."""
    if isinstance(node, dict):
        if not root and any(isinstance(node.get(k), str) for k in ("$id", "id")):
            return True
        return any(_holds_id(v) for k, v in node.items() if k not in ("enum", "const", "default"))
    if isinstance(node, list):
        return any(_holds_id(v) for v in node)
    return False


def _unused_name(defs: Any) -> str:
    name = _DEF_NAME
    while isinstance(defs, dict) and name in defs:
        name += "_"
    return name


# ---- outlines: its regex -------------------------------------------------------------

# outlines-core 0.2.14 spells every JSON number with these two fragments (its INTEGER
# and NUMBER), free-form values included; text no other part of its regex holds, but
# a schema's own pattern might.
_OUTLINES_INTEGER = r"(-)?(0|[1-9][0-9]*)"
_OUTLINES_NUMBER = r"((-)?(0|[1-9][0-9]*))(\.[0-9]+)?([eE][+-][0-9]+)?"


def _up_to(limit: str) -> str:
    """A regex alternation of the naturals in [0, limit] (``limit``: its decimal digits),
    without leading zeros: ``limit`` itself, those of its length below it (equal up to
    a digit, lower there), then the shorter ones. Longest first: outlines-core's DFA is
    leftmost-first, so a shorter alternative first would end the match early."""
    alternatives = [limit]
    for i, digit in enumerate(limit):
        low, high = (1 if i == 0 else 0), int(digit) - 1
        if high < low:
            continue
        rest = len(limit) - i - 1
        digits = str(low) if low == high else f"[{low}-{high}]"
        alternatives.append(limit[:i] + digits + (f"[0-9]{{{rest}}}" if rest else ""))
    if len(limit) > 1:
        alternatives.append(f"[1-9][0-9]{{0,{len(limit) - 2}}}")
    return "|".join([*alternatives, "0"])


_MAX = str(MAX_SAFE_INTEGER)
_BOUNDED_INTEGER = f"-?({_up_to(_MAX)})"
# The integer part below the maximum takes any fraction; the maximum only zeros.
_BOUNDED_NUMBER = (
    f"-?({_MAX}(\\.0{{1,{FRACTION_DIGITS}}})?"
    f"|({_up_to(_MAX).removeprefix(_MAX + '|')})(\\.[0-9]{{1,{FRACTION_DIGITS}}})?)"
)


def bound_regex(regex: str, schema_text: str) -> str:
    """outlines-core's regex for the schema ``schema_text`` with every number bounded.

    Raises:
        UnsupportedGrammarError: a pattern of the schema holds outlines-core's own number
            regex, which would be bounded with the rest.
    """
    if _OUTLINES_INTEGER in schema_text:  # the number fragment holds it too
        raise UnsupportedGrammarError(
            "json_schema",
            f"a pattern holds {_OUTLINES_INTEGER}, the regex outlines-core spells numbers "
            "with, so the outlines backend cannot bound numbers apart from it; use "
            "grammar_backend='llguidance', or json_bounded_numbers=False",
        )
    regex = regex.replace(_OUTLINES_NUMBER, f"({_BOUNDED_NUMBER})")
    return regex.replace(_OUTLINES_INTEGER, f"({_BOUNDED_INTEGER})")


@functools.cache
def _constraining() -> frozenset[str]:
    """2020-12's validation keywords: in check_schema's output every keyword is
    2020-12's, so a node without one of these allows any JSON value."""
    # jsonschema's import builds rfc3987_syntax's IRI grammar (about a second
    # of CPU), which every process importing the server (each CLI command) would pay
    import jsonschema  # lazy: only schema and tools requests need it

    return frozenset(jsonschema.Draft202012Validator.VALIDATORS)
