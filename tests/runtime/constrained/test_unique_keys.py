"""Equality keys: two JSON values share a key exactly when jsonschema's uniqueItems
finds them equal (on values whose numbers a float holds exactly)."""

from __future__ import annotations

import itertools
import json
from decimal import Decimal

from jsonschema._utils import equal

from radixlm.runtime.constrained.unique_keys import canonical, spellings, value_keys

VALUES = [
    0, 1, 1.0, -0.0, 2.5, True, False, None, "", "a", "1", "true",
    [], [1], [1.0], [True], [[1, "a"]], [[1.0, "a"]], [1, 2], [2, 1],
    {}, {"a": 1}, {"a": 1.0}, {"a": True}, {"a": 1, "b": [2]}, {"b": [2.0], "a": 1},
    {"a": {"b": None}}, {"a": {"b": False}},
]  # fmt: skip


def _schema_value(value):
    """``value`` as a schema's enum holds it (numbers parsed as Decimal)."""
    return json.loads(json.dumps(value), parse_float=Decimal)


def test_keys_are_shared_exactly_when_jsonschema_finds_values_equal():
    for one, two in itertools.product(VALUES, repeat=2):
        shared = bool(set(value_keys(_schema_value(one))) & set(value_keys(_schema_value(two))))
        assert shared == equal(one, two), (one, two)


def test_a_number_inside_an_item_has_one_canonical_key():
    assert canonical(value_keys(Decimal("1.0"))) == ("f", 1.0)
    assert value_keys({"a": 10**400}) == (("o", frozenset({(("s", "a"), ("f", float("inf")))})),)


def test_spellings_of_scalars():
    assert spellings(("s", "ab")) == (b'"ab"',)
    assert spellings(("s", 'a"b')) == ()  # needs an escape
    assert spellings(("f", 1.0)) == (b"1", b"1.0")
    assert spellings(("f", 0.5)) == (b"0.5",)
    assert spellings(("b", False)) == (b"false",)
    assert spellings(("z", None)) == (b"null",)
    assert spellings(("a", ())) == ()
