"""Equality keys of JSON values as ``uniqueItems`` compares them (the guard of
``unique_items``).

jsonschema's ``uniq`` treats two items as equal when ``_utils.equal`` says so: strings
by decoded value, numbers by value (``1 == 1.0``) but never a boolean as a number
(``true != 1``), arrays elementwise, objects by their keys and values whatever the
order. A value's keys are tuples tagged by kind, so Python's own ``==`` and ``hash``
do that comparison::

    "a"        -> ("s", "a")                     true  -> ("b", True)
    1, 1.0     -> ("n", Decimal) and ("f", 1.0)  null  -> ("z", None)
    [1, "a"]   -> ("a", (("f", 1.0), ("s", "a")))
    {"k": 1}   -> ("o", frozenset({(("s", "k"), ("f", 1.0))}))

A scalar item has one key per reading of it (a number: its exact value and its
float), and two items are equal when any key is shared: a validator that parses floats
sees 0.1 and 0.10000000000000000001 as one value, so both count (narrower, safe). A
value inside an array or object item has one canonical key (``canonical``): a
number's float, equal whenever the exact values are (narrower again). Raw bytes that
do not decode (bad UTF-8, a bad escape, a number ``Decimal`` cannot read) key as
``("r", raw)``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = [
    "Key",
    "canonical",
    "decimal_keys",
    "is_seen",
    "number_keys",
    "plain_raw",
    "spellings",
    "string_keys",
    "value_keys",
]

Key = tuple[str, Any]  # ("s", text) | ("n", Decimal) | ("f", float) | ("b", bool) | ...

_MAX_EXACT_INT = 2**53  # floats at or past it are spelled as Python spells floats


def value_keys(value: Any) -> tuple[Key, ...]:
    """A schema value's equality keys (``enum``/``const`` values parsed with
    ``parse_float=Decimal``)."""
    if isinstance(value, bool):
        return (("b", value),)
    if value is None:
        return (("z", None),)
    if isinstance(value, str):
        return (("s", value),)
    if isinstance(value, (int, Decimal)):
        return decimal_keys(Decimal(value))
    return (_nested_key(value),)


def _nested_key(value: Any) -> Key:
    """The canonical key of a schema value (a member or element of an item)."""
    if isinstance(value, list):
        return ("a", tuple(_nested_key(v) for v in value))
    if isinstance(value, dict):
        return ("o", frozenset((("s", k), _nested_key(v)) for k, v in value.items()))
    return canonical(value_keys(value))


def decimal_keys(number: Decimal) -> tuple[Key, ...]:
    # float(Decimal) never overflows (float(int) can): a huge number is inf.
    return (("n", number), ("f", float(number)))


def string_keys(raw: bytes) -> tuple[Key, ...]:
    """The keys of a string whose JSON text between the quotes is ``raw``."""
    try:
        text = json.loads(b'"' + raw + b'"', strict=False) if b"\\" in raw else raw.decode()
    except ValueError:  # not valid UTF-8 or a bad escape: the grammar let it through
        return (("r", raw),)
    return (("s", text),)


def number_keys(raw: bytes) -> tuple[Key, ...]:
    try:
        return decimal_keys(Decimal(raw.decode()))
    except (InvalidOperation, ValueError):
        return (("r", raw),)


def canonical(keys: Sequence[Key]) -> Key:
    """The one key a value has inside an item: the last of its keys (a number's float;
    the only key of any other value)."""
    return keys[-1]


def is_seen(keys: Sequence[Key], seen: set[Key]) -> bool:
    return any(k in seen for k in keys)


def plain_raw(key: Key) -> bytes | None:
    """A string key's raw JSON form when it needs no escape (else None: no raw without a
    backslash spells it)."""
    if key[0] != "s" or any(c in '"\\' or c < " " for c in key[1]):
        return None
    try:
        return key[1].encode()
    except UnicodeEncodeError:  # a lone surrogate from a \ud800 escape
        return None


def spellings(key: Key) -> tuple[bytes, ...]:
    """The usual JSON texts of the scalar a canonical key stands for: a string without
    escapes, a literal, a number as an integer (when whole) or as Python spells the
    float; () for anything else (an object, an array, a string needing escapes)."""
    kind, value = key
    if kind == "s":
        raw = plain_raw(key)
        return () if raw is None else (b'"' + raw + b'"',)
    if kind == "b":
        return (b"true" if value else b"false",)
    if kind == "z":
        return (b"null",)
    if kind == "f" and value == value and abs(value) != float("inf"):
        text = repr(value).encode()
        if value.is_integer() and abs(value) < _MAX_EXACT_INT:
            return (str(int(value)).encode(), text)
        return (text,)
    return ()
