"""Negation and conditionals in the keywords llguidance enforces, each exact, for
``schema_check``'s rewrites.

``not S`` and ``if C then T else E`` have no counterpart in a grammar, but the forms real
schemas use do, as anyOf branches:

    not {type: X}            -> {type: every other type}
    not {required: [a, b]}   -> an object lacking a, or lacking b
    not {const / enum V}     -> another type, a string no V spells (a regex over V's
                                trie), a number outside V (open intervals), the other
                                boolean
    not {properties: {k: S}} -> an object with k present and its value in not S
    not {pattern: ^C{m,n}$}  -> a string holding a character outside the class C, or
                                of a length outside m..n (one class repeated only)
    not {pattern: ^text$}    -> a string other than the text (a regex over its trie)
    not {oneOf: [A]}         -> not A
    not {allOf: [A, B ...]}  -> not A, or not B, ...
    not {anyOf: [A, B ...]}  -> not A, and not B, ...
    not {minimum: m} (and the other bounds of numbers, lengths, items, properties)
                             -> a number below m (a value of the bound's type past it)
    not (A and B ...)        -> not A, or not B, ...  (a node's keywords all apply)
    not {type: integer}      -> (narrowing only) the other types: no keyword says "a
                                number but not an integer"
    if C then T else E       -> anyOf [C and T, (not C) and E]

Many ``if {properties: {k: {const: c_i}}} then T_i`` in one allOf (a discriminator
table: ``kind`` chooses the rest) would be 2^n branches read one by one; read together
they are n + 2: k is some c (its thens, the others' elses), k is none of them (every
else), or the value has no k (every if holds vacuously: every then).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = [
    "NOTE_KEYWORDS",
    "complement_regex",
    "conditional",
    "discriminator_table",
    "negation",
    "pattern_literal",
]

_TYPES = ("null", "boolean", "object", "array", "string", "number")
# Keywords that only annotate a subschema.
NOTE_KEYWORDS = frozenset({"title", "description", "$comment", "examples", "default", "deprecated"})
_ANY_CHAR = r"[\s\S]"
_END = ""  # the trie's end-of-string mark (no character is empty)


def negation(sub: Any, narrowing: bool = False) -> Any:
    """A subschema accepting exactly the values ``sub`` rejects, for the forms in the
    module docstring; None for any other. ``narrowing``: where the exact form has no
    keyword here, one accepting some of those values only (never one ``sub`` accepts):
    ``not {type: integer}`` the other types, the numbers that are not integers left out."""
    if sub is True or sub == {}:
        return False
    if sub is False:
        return {}
    if not isinstance(sub, dict):
        return None
    keys = set(sub) - NOTE_KEYWORDS
    if "type" in keys and keys & {"const", "enum"}:
        keys -= {"type"}  # the values say their types
    branches: list[Any] = []
    for key in sorted(keys):
        negated = _negated_keyword(key, sub, narrowing)
        if negated is None:
            return None
        if negated is not False:
            branches.append(negated)
    if not branches:
        return False
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def conditional(if_: Any, then: Any, else_: Any) -> Any:
    """``if if_ then then else else_`` as one subschema; None where ``if_`` has no
    negation here."""
    negated = negation(if_)
    if negated is None:
        return None
    return {"anyOf": [_both(if_, then), _both(negated, else_)]}


def discriminator_table(members: list) -> tuple[list, Any] | None:
    """allOf ``members`` with two or more ``if {properties: {k: {const: c}}} then ...``
    on one property k, as (the other members, the one subschema replacing those); None
    where there are fewer than two."""
    tables: dict[str, list[dict]] = {}
    for member in members:
        name = _discriminator(member)
        if name is not None:
            tables.setdefault(name, []).append(member)
    name, rows = max(tables.items(), key=lambda item: len(item[1]), default=(None, []))
    if name is None or len(rows) < 2:
        return None
    rest = [m for m in members if not any(m is row for row in rows)]
    values = [_if_value(row, name) for row in rows]
    distinct: list[Any] = []
    for value in values:
        if not any(_same(value, seen) for seen in distinct):
            distinct.append(value)
    branches = []
    for value in distinct:
        chosen = [_then(r) if _same(v, value) else _else(r) for r, v in zip(rows, values)]
        cond = {"type": "object", "required": [name], "properties": {name: {"const": value}}}
        branches.append(_all(cond, chosen))
    other = negation({"enum": distinct})
    cond = {"type": "object", "required": [name], "properties": {name: other}}
    branches.append(_all(cond, [_else(r) for r in rows]))
    absent = {
        "anyOf": [{"type": [t for t in _TYPES if t != "object"]}, {"properties": {name: False}}]
    }
    branches.append(_all(absent, [_then(r) for r in rows]))
    return rest, {"anyOf": branches}


def _negated_keyword(key: str, sub: dict, narrowing: bool) -> Any:
    """not (``sub``'s keyword ``key``), or None (``narrowing``: ``negation``'s)."""
    value = sub[key]
    if key == "type":
        types = {value} if isinstance(value, str) else set(value)
        if "integer" in types and "number" not in types:
            if not narrowing:
                return None  # "a number but not an integer" has no type keyword
            types.add("number")  # the numbers that are not integers left out
        rest = [t for t in _TYPES if t not in types]
        return {"type": rest} if rest else False
    if key == "required":
        if not value:
            return False
        # an object without one of them (required holds for any other value)
        return {"type": "object", "anyOf": [{"properties": {name: False}} for name in value]}
    if key in ("const", "enum"):
        values = [value] if key == "const" else value
        return _not_values(values) if isinstance(values, list) else None
    if key == "properties" and isinstance(value, dict):
        branches = []
        for name, schema in value.items():
            negated = negation(schema, narrowing)
            if negated is None:
                return None
            if negated is not False:
                present = {"type": "object", "required": [name]}
                branches.append({**present, "properties": {name: negated}})
        if not branches:
            return False
        return branches[0] if len(branches) == 1 else {"anyOf": branches}
    if key == "allOf" and isinstance(value, list):
        members = [negation(member, narrowing) for member in value]
        if any(m is None for m in members):
            return None
        kept = [m for m in members if m is not False]
        if not kept:
            return False
        return kept[0] if len(kept) == 1 else {"anyOf": kept}
    if key == "anyOf" and isinstance(value, list):
        members = [negation(member, narrowing) for member in value]
        if any(m is None for m in members):
            return None
        if any(m is False for m in members):
            return False  # a member takes everything: so does the anyOf
        return members[0] if len(members) == 1 else {"allOf": members}
    if key in _BOUND_NEGATIONS and isinstance(value, (int, float)) and not isinstance(value, bool):
        kind, opposite, shift = _BOUND_NEGATIONS[key]
        if value + shift < 0:
            return False  # every value holds it (others vacuously)
        return {"type": kind, opposite: value + shift}
    if key == "oneOf" and isinstance(value, list) and len(value) == 1:
        return negation(value[0], narrowing)  # exactly one of one: that one
    if key == "pattern" and isinstance(value, str):
        literal = pattern_literal(value)
        if literal is not None:  # ^text$: a string other than the text
            return {"type": "string", "pattern": complement_regex([literal])}
        return _not_repeated_class(value)
    return None


def pattern_literal(pattern: Any) -> str | None:
    """The one string ``pattern`` matches where it is ``^`` literal ``$`` (letters,
    digits and escaped punctuation only), else None."""
    if not isinstance(pattern, str):
        return None
    match = re.fullmatch(r"\^((?:[A-Za-z0-9 _-]|\\[^A-Za-z0-9])*)\$", pattern)
    return None if match is None else re.sub(r"\\(.)", r"\1", match[1])


# not {keyword: v} for a bound: a value of the bound's type past it (the opposite
# keyword at v + shift; counts are integers, numbers exclusive); other types hold it.
_BOUND_NEGATIONS = {
    "minimum": ("number", "exclusiveMaximum", 0),
    "maximum": ("number", "exclusiveMinimum", 0),
    "exclusiveMinimum": ("number", "maximum", 0),
    "exclusiveMaximum": ("number", "minimum", 0),
    "minLength": ("string", "maxLength", -1),
    "maxLength": ("string", "minLength", 1),
    "minItems": ("array", "maxItems", -1),
    "maxItems": ("array", "minItems", 1),
    "minProperties": ("object", "maxProperties", -1),
    "maxProperties": ("object", "minProperties", 1),
}


# ^C{m,n}$ where C is one character class or one escaped / plain character: the only
# patterns whose complement is written here (no regex complement in general).
_REPEATED_CLASS = re.compile(
    r"\^(?P<cls>\[(?:\\.|[^\]\\])+\]|\\[^dDwWsSbB0-9]|[^\\\[\](){}|.*+?^$])"
    r"(?P<rep>[*+?]|\{\d+(?:,\d*)?\})?\$"
)


def _not_repeated_class(pattern: str) -> Any:
    """Strings ``^C{m,n}$`` refuses (C one character class), or None for another pattern."""
    match = _REPEATED_CLASS.fullmatch(pattern)
    if match is None:
        return None
    cls, rep = match["cls"], match["rep"] or "{1}"
    if cls.startswith("[^"):
        outside = "[" + cls[2:]
    elif cls.startswith("["):
        outside = "[^" + cls[1:]
    else:
        outside = "[^" + cls + "]"
    low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}.get(rep, (None, None))
    if low is None:
        bounds = rep[1:-1].split(",")
        low = int(bounds[0])
        high = low if len(bounds) == 1 else (int(bounds[1]) if bounds[1] else None)
    branches: list[Any] = [{"type": "string", "pattern": outside}]
    if low > 0:
        branches.append({"type": "string", "maxLength": low - 1})
    if high is not None:
        branches.append({"type": "string", "minLength": high + 1})
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def _not_values(values: list) -> Any:
    """Every JSON value not in ``values`` (scalars only; None if one is not)."""
    if any(isinstance(v, (dict, list)) for v in values):
        return None
    strings = sorted({v for v in values if isinstance(v, str)})
    numbers = sorted({v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)})
    booleans = {v for v in values if isinstance(v, bool)}
    present = {"string"} if strings else set()
    present |= {"number"} if numbers else set()
    present |= {"boolean"} if booleans else set()
    present |= {"null"} if None in values else set()
    branches: list[Any] = []
    rest = [t for t in _TYPES if t not in present]
    if rest:
        branches.append({"type": rest})
    if strings:
        branches.append({"type": "string", "pattern": complement_regex(strings)})
    if numbers:
        branches.append({"type": "number", "exclusiveMaximum": numbers[0]})
        for low, high in zip(numbers, numbers[1:]):
            branches.append({"type": "number", "exclusiveMinimum": low, "exclusiveMaximum": high})
        branches.append({"type": "number", "exclusiveMinimum": numbers[-1]})
    if len(booleans) == 1:
        branches.append({"const": not next(iter(booleans))})
    if not branches:
        return False
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def complement_regex(strings: list[str]) -> str:
    """An anchored regex matching every string except ``strings``: a walk of their trie
    that leaves it (another character), stops where no string ends, or runs past the
    end of one."""
    trie: dict = {}
    for s in strings:
        node = trie
        for ch in s:
            node = node.setdefault(ch, {})
        node[_END] = {}
    return f"^(?:{_trie_complement(trie)})$"


def _trie_complement(node: dict) -> str:
    parts = [] if _END in node else [""]
    chars = sorted(ch for ch in node if ch != _END)
    parts += [f"{re.escape(ch)}(?:{_trie_complement(node[ch])})" for ch in chars]
    leave = "[^" + "".join(_class_escape(ch) for ch in chars) + "]" if chars else _ANY_CHAR
    parts.append(f"{leave}{_ANY_CHAR}*")
    return "|".join(parts)


def _class_escape(ch: str) -> str:
    return "\\" + ch if ch in "\\]^-[" else ch


def _discriminator(member: Any) -> str | None:
    """k, where ``member`` is ``{if: {properties: {k: {const: c}}}, then[, else]}``."""
    if not isinstance(member, dict) or set(member) - NOTE_KEYWORDS - {"then", "else"} != {"if"}:
        return None
    cond = member["if"]
    if not isinstance(cond, dict) or set(cond) - NOTE_KEYWORDS != {"properties"}:
        return None
    props = cond["properties"]
    if not isinstance(props, dict) or len(props) != 1:
        return None
    ((name, schema),) = props.items()
    if not isinstance(schema, dict) or set(schema) - NOTE_KEYWORDS != {"const"}:
        return None
    return name if not isinstance(schema["const"], (dict, list)) else None


def _same(a: Any, b: Any) -> bool:
    """JSON equality of scalars (1 == 1.0, but true != 1)."""
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def _if_value(member: dict, name: str) -> Any:
    return member["if"]["properties"][name]["const"]


def _then(member: dict) -> Any:
    return member.get("then", True)


def _else(member: dict) -> Any:
    return member.get("else", True)


def _all(cond: Any, parts: list) -> Any:
    """``cond`` and every one of ``parts`` (true ones left out)."""
    kept = [p for p in parts if p is not True and p != {}]
    if cond is False or any(p is False for p in kept):
        return False
    return {"allOf": [cond, *kept]} if kept else cond


def _both(a: Any, b: Any) -> Any:
    return _all(a, [b]) if a is not True and a != {} else b
