"""``schema_facts``: oneOf branches told apart only when no value matches two, narrowed
exactly where one is a finite set (checked with jsonschema over values that probe each
branch), and llguidance enforcing the oneOfs this reads as anyOf."""

from __future__ import annotations

import json

import jsonschema
import pytest

from radixlm.runtime.constrained import GrammarSpec
from radixlm.runtime.constrained.schema_facts import SchemaFacts, exclusive_branches
from radixlm.runtime.constrained.schema_logic import NOTE_KEYWORDS
from tests.runtime.constrained.conftest import assert_enforced

VOCABULARY = frozenset({"const", "enum", "type", "required", "properties"})
VALUES = [
    None, True, 0, 1, 2.5, "", ".", "a", "abcd", "0123", "window", "inline", "http://a.b",
    [], [1], {}, {"a": 1}, {"b": 1}, {"a": 1, "b": 1}, {"$x": 1}, {"$x": "s"}, {"y": {"$x": 1}},
    {"y": 1}, "$AB", "$", "123e4567-e89b-12d3-a456-426614174000", "2024-01-02",
    {"a": "s"}, {"b": "s"}, {"a": "s", "b": 1}, {"a": "s", "b": "s"}, "ab", "{{x}}", "a{{b}}c",
    "./x", "x:y", "a:b:1", "::1", "a.b", "http://www.ab", "https://ab", "a/b", "a/b.c/d", "~x",
    "/x", "|x", {"kind": "a"}, {"kind": "b"}, {"kind": "c"}, {"kind": "a", "n": 1},
]  # fmt: skip
UUID = "123e4567-e89b-12d3-a456-426614174000"
DEFS = {
    "x": {"type": "object", "properties": {"$x": {"type": "integer"}}, "required": ["$x"],
          "additionalProperties": False},
    "doc": {"type": "object", "patternProperties": {"^[^$]": {"$ref": "#/$defs/value"}},
            "additionalProperties": False},
    "value": {"anyOf": [{"type": "integer"}, {"$ref": "#/$defs/doc"}]},
    "base": {"type": "object", "properties": {"kind": {"type": "string"}}, "required": ["kind"]},
}  # fmt: skip
# Objects of kind a and of kind b: the const in one allOf member, required in the other.
KIND_A = {"allOf": [{"$ref": "#/$defs/base"}, {"properties": {"kind": {"const": "a"}}}]}
KIND_B = {"allOf": [{"$ref": "#/$defs/base"}, {"properties": {"kind": {"const": "b"}}}]}


def _facts(defs: dict | None = None) -> SchemaFacts:
    return SchemaFacts({"$defs": defs or {}}, VOCABULARY)


def _valid(schema: dict, value, defs: dict | None = None) -> bool:
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    document = {"$defs": defs or {}, **schema}
    return jsonschema.Draft202012Validator(document, format_checker=checker).is_valid(value)


@pytest.mark.parametrize(
    ("parent", "branches"),
    [
        ({"type": "string"}, [{"enum": ["window"]}, {"enume": ["inline"]}]),  # a typo: any
        (
            {},
            [
                {"type": "string", "pattern": "^[0-9a-f]{4}$"},
                {"type": "string", "enum": ["", "abcd"]},
                {"type": "null"},
            ],
        ),  # fmt: skip
        ({"type": "string"}, [{"format": "uri"}, {"enum": [".", "http://a.b"]}]),
        (
            {},
            [
                {
                    "type": "object",
                    "required": ["a"],
                    "additionalProperties": False,
                    "properties": {"a": {}},
                },
                {"type": "object", "required": ["b"]},
            ],
        ),  # fmt: skip
        ({}, [{"$ref": "#/$defs/x"}, {"$ref": "#/$defs/doc"}, {"type": "string"}]),
        (
            {},
            [
                {
                    "type": "object",
                    "anyOf": [
                        {"required": ["a"], "properties": {"a": {"type": "integer"}}},
                        {"required": ["b"], "properties": {"b": {"type": "integer"}}},
                    ],
                },
                {"type": "object", "additionalProperties": {"type": "string"}},
            ],
        ),  # fmt: skip
        # strings told apart by their first character; any other value matches both
        ({}, [{"format": "uuid"}, {"pattern": "^\\$[A-Z0-9-_]+"}]),
        ({}, [{"format": "date"}, {"pattern": "^[a-z]"}, {"type": "null"}]),
        # objects told apart by a required property; any other value matches both
        ({}, [{"required": ["a"]}, {"properties": {"a": False}}]),
        # each takes every value of a type the other constrains: it keeps what the other
        # refuses of it (objects without a, numbers below 3)
        ({}, [{"required": ["a"]}, {"minimum": 3}]),
        # the same branch twice: no value matches one of them alone
        ({}, [{"$ref": "#/$defs/x"}, {"$ref": "#/$defs/x", "title": "again"}]),
        ({}, [{"$ref": "#/$defs/x"}, {"$ref": "#/$defs/x"}, {"type": "string"}]),
        # overlapping, each with a negation: each keeps what the other refuses
        (
            {"type": "object"},
            [{"properties": {"a": {"type": "string"}}}, {"properties": {"b": {"type": "string"}}}],
        ),  # fmt: skip
        # two infinite sets of strings that overlap: each keeps what the other refuses
        ({}, [{"type": "string", "minLength": 2}, {"type": "string", "maxLength": 3}]),
        # told apart by a character one needs and the other's alphabet lacks
        (
            {"type": "string"},
            [{"pattern": "^[0-9a-zA-Z_-]{1,255}$"}, {"minLength": 4, "pattern": ".*\\{\\{.+}}.*"}],
        ),  # fmt: skip
        # a URI starts with its scheme's letter, holds a colon no hostname holds
        ({"type": "string"}, [{"format": "uri"}, {"pattern": "^\\./.+$"}]),
        ({"type": "string"}, [{"format": "uri"}, {"format": "hostname"}]),
        ({"type": "string"}, [{"format": "ipv6"}, {"format": "hostname"}]),
        # a colon needed outside the groups, an alphabet of classes, groups and literals
        (
            {"type": "string"},
            [
                {"pattern": "^https?:\\/\\/(www\\.)?[a-z]+$"},
                {"pattern": "^[a-z-_0-9]+/[a-z.]+(/[a-z]+)?$"},
            ],
        ),  # fmt: skip
        # first characters from a class holding a bar
        ({"type": "string"}, [{"pattern": "^[~|/][a-z]+$"}, {"pattern": "^[a-z]+/[a-z]+$"}]),
        # a colon needed, and refused by a negated class
        ({"type": "string"}, [{"pattern": "^[^:]+$"}, {"pattern": "^[^:]+:[^:]+:[0-9]+$"}]),
        # a discriminator whose const and required sit in different allOf members
        ({}, [KIND_A, KIND_B]),
    ],
    ids=lambda v: json.dumps(v)[:60],
)
def test_exclusive_branches_keep_exactly_the_values_of_one_branch(parent, branches):
    exclusive = exclusive_branches(_facts(DEFS), branches, parent)
    assert exclusive is not None
    one_of = {**parent, "oneOf": branches}
    any_of = {**parent, "anyOf": exclusive} if exclusive else False
    for value in VALUES:
        expected = _valid(one_of, value, DEFS)
        assert (_valid(any_of, value, DEFS) if any_of else False) == expected, value


@pytest.mark.parametrize(
    "branches",
    [
        # arrays told apart only by what an item may be: no keyword says "holds one not in"
        [{"type": "array", "items": {"enum": [1, 2]}}, {"type": "array", "items": {"enum": [2]}}],
        # two infinite sets of strings that overlap, neither with a negation here
        [{"type": "string", "pattern": "a"}, {"type": "string", "pattern": "b"}],
        # numbers but not integers: narrowing "not an integer" would leave none
        [{"type": "integer"}, {"type": "number"}],
    ],
    ids=lambda v: json.dumps(v)[:60],
)
def test_pairs_neither_told_apart_nor_narrowed_are_left_to_the_backend(branches):
    assert exclusive_branches(_facts(), branches, {}) is None


@pytest.mark.parametrize(
    ("parent", "branches"),
    [
        # strings: a literal pattern another pattern refuses, literal prefixes, lengths
        ({"type": "string"}, [{"pattern": "^Abs$"}, {"pattern": "^Add$"}]),
        ({"type": "string"}, [{"pattern": "^Abs$"}, {"enum": ["Add", "Abc"]}]),
        (
            {},
            [
                {"type": "string", "pattern": "^pkg:cargo/.+"},
                {"type": "string", "pattern": "^pkg:c/.+"},
            ],
        ),
        # patterns whose automata share no string (neither first characters nor
        # alphabets tell these apart)
        (
            {"type": "string"},
            [{"pattern": "^u?int(8|16|256)?(\\[[0-9]*\\])*$"}, {"pattern": "^u?fixed(0x8|8x0)$"}],
        ),
        (
            {"type": "string"},
            [{"pattern": "^([a-zA-Z][^:]|[^/@a-zA-Z])[^/]*$"}, {"pattern": "^([a-zA-Z]:)?/.*$"}],
        ),
        ({"type": "string"}, [{"maxLength": 0}, {"minLength": 1}]),
        ({"type": "string"}, [{"maxLength": 0}, {"pattern": "^[0-9]+$"}]),
        ({"type": "string"}, [{"format": "ipv4"}, {"format": "ipv6"}]),
        ({"type": "string"}, [{"format": "date"}, {"format": "date-time"}]),
        # numbers: ranges with no number in both
        ({"type": "integer"}, [{"minimum": -1, "maximum": -1}, {"minimum": 50, "maximum": 100}]),
        ({"type": "number"}, [{"exclusiveMaximum": 2}, {"minimum": 2}]),
        # untyped, it requires what the other (an object) refuses: no value takes both
        (
            {},
            [
                {"required": ["a"], "additionalProperties": False, "properties": {"a": {}}},
                {"type": "object", "additionalProperties": False, "properties": {"b": {}}},
            ],
        ),
        # a $ref with keywords beside it reads as both
        (
            {"type": "object"},
            [{"$ref": "#/$defs/x", "properties": {"a": False}}, {"required": ["a"]}],
        ),
    ],
    ids=lambda v: json.dumps(v)[:60],
)
def test_more_pairs_told_apart_exactly(parent, branches):
    facts = _facts(DEFS)
    assert facts.told_apart(branches[0], branches[1], parent)
    values = [*VALUES, "Abs", "Abs\n", "Add", "pkg:cargo/x", "pkg:c/x", -1, 50, 101, 1.5, 2,
              "uint8", "uint", "int256[]", "ufixed8x0", "fixed0x8", "C:/x", "/x", "ab", "@/x",
              "1.2.3.4", "::1", "::ffff:1.2.3.4", "2024-01-02T03:04:05Z"]  # fmt: skip
    one_of = {**parent, "oneOf": branches}
    any_of = {**parent, "anyOf": exclusive_branches(facts, branches, parent)}
    for value in values:
        assert _valid(any_of, value, DEFS) == _valid(one_of, value, DEFS), value


@pytest.mark.parametrize(
    ("parent", "branches", "kept", "dropped"),
    [
        # a discriminating property neither branch requires: each now requires it
        (
            {"type": "object"},
            [
                {"properties": {"shape": {"enum": ["square"]}, "side": {"type": "number"}}},
                {"properties": {"shape": {"enum": ["circle"]}, "radius": {"type": "number"}}},
            ],
            [{"shape": "square", "side": 1}, {"shape": "circle"}],
            [{"radius": "r"}],  # only square's branch took it: dropped, it has no shape
        ),
        # the discriminator declared behind a $ref and an allOf member
        (
            {},
            [
                {"type": "object", "allOf": [{"$ref": "#/$defs/tagged_a"}]},
                {"type": "object", "allOf": [{"$ref": "#/$defs/tagged_b"}]},
            ],
            [{"t": "a"}, {"t": "b", "n": 1}],
            [],
        ),
        # closed objects, each declaring a property the other refuses
        (
            {},
            [
                {"type": "object", "additionalProperties": False, "properties": {"and": {}}},
                {"type": "object", "additionalProperties": False, "properties": {"or": {}}},
            ],
            [{"and": 1}, {"or": [2]}],
            [],
        ),
        # one takes every array, the other some (no negation here): neither keeps arrays
        (
            {},
            [{"required": ["a"]}, {"type": "array", "items": {"pattern": "^x"}}],
            [{"a": 1}, "s", 5],
            [["y"]],  # only the first took it
        ),
        # arrays whose items are told apart: [] matched both
        (
            {},
            [
                {"type": "array", "items": {"type": "number"}},
                {"type": "array", "items": {"type": "string"}},
            ],
            [[1, 2], ["a"]],
            [],
        ),
        # objects whose properties overlap, "not an integer" narrowed the same way
        (
            {"type": "object"},
            [
                {"properties": {"min": {"type": "integer"}}},
                {"properties": {"exact": {"type": "integer"}}},
            ],
            [{"min": 1, "exact": "s"}],
            [{"min": 1, "exact": 1.5}],
        ),
    ],
    ids=lambda v: json.dumps(v)[:60],
)
def test_narrowed_branches_keep_only_values_of_exactly_one(parent, branches, kept, dropped):
    defs = {
        **DEFS,
        "tagged_a": {"properties": {"t": {"const": "a"}}},
        "tagged_b": {"properties": {"t": {"const": "b"}, "n": {"type": "integer"}}},
    }
    facts = _facts(defs)
    exclusive = exclusive_branches(facts, branches, parent)
    assert exclusive is not None
    one_of = {**parent, "oneOf": branches}
    any_of = {**parent, "anyOf": exclusive}
    probes = [*VALUES, *kept, *dropped, {"shape": "square", "radius": 2}, {"t": "a", "n": 1},
              {"and": 1, "or": 2}, {"t": "c"}, [1, "a"]]  # fmt: skip
    for value in probes:  # never a value the oneOf refuses
        if _valid(any_of, value, defs):
            assert _valid(one_of, value, defs), value
    for value in kept:
        assert _valid(any_of, value, defs), value
    for value in dropped:
        assert _valid(one_of, value, defs) and not _valid(any_of, value, defs), value


def test_pattern_prefixes_and_literals():
    from radixlm.runtime.constrained.schema_facts import _pattern_prefix
    from radixlm.runtime.constrained.schema_logic import pattern_literal

    assert pattern_literal("^Abs$") == "Abs"
    assert pattern_literal("^a\\.b$") == "a.b"
    assert pattern_literal("^a.b$") is None and pattern_literal("Abs") is None
    assert _pattern_prefix("^pkg:cargo/.+@.+") == "pkg:cargo/"
    assert _pattern_prefix("^abc*") == "ab" and _pattern_prefix("^ab?c") == "a"
    assert _pattern_prefix("^a\\.b{2}") == "a."
    assert _pattern_prefix("^[a-z]x") is None and _pattern_prefix("^ab|c") is None
    # a search's $ matches before a last newline too: "Abs\n" matches ^Abs$
    assert not _facts().told_apart({"pattern": "^Abs$"}, {"enum": ["Abs\n"]}, {"type": "string"})


def test_required_tells_objects_apart_only_where_the_value_is_an_object():
    a, b = {"required": ["a"]}, {"properties": {"a": False}}
    assert not _facts().told_apart(a, b, {})  # 5 matches both
    assert _facts().told_apart(a, b, {"type": "object"})


def test_annotations_never_tell_branches_apart():
    a = {"type": "string", "title": "A", "description": "one"}
    b = {"type": "string", "title": "B", "description": "two"}
    assert set(a) - NOTE_KEYWORDS == {"type"}
    assert not _facts().told_apart(a, b, {})


def test_llguidance_enforces_a_one_of_told_apart_through_refs(compiler, hf_tokenizer):
    # a document store's value: scalars, tagged objects ({"$x": 1}) and documents whose
    # keys never start with $ (llguidance alone cannot prove these exclusive)
    schema = {"$defs": DEFS, "type": "object", "properties": {"v": {"oneOf": [
        {"type": "string"}, {"$ref": "#/$defs/x"}, {"$ref": "#/$defs/doc"}]}},
        "required": ["v"], "additionalProperties": False}  # fmt: skip
    compiled = compiler.compile(GrammarSpec("json_schema", json.dumps(schema)), "llguidance")
    good = ['{"v":"s"}', '{"v":{"$x":1}}', '{"v":{"a":1}}', '{"v":{"a":{"b":2}}}', '{"v":{}}']
    bad = ['{"v":{"$x":"s"}}', '{"v":{"$y":1}}', '{"v":{"a":"s"}}', '{"v":1}']
    assert_enforced(compiled, hf_tokenizer, schema, good, bad)


def test_llguidance_enforces_a_one_of_narrowed_to_its_discriminator(compiler, hf_tokenizer):
    # no branch requires "shape", so {} matched all three: each now requires it
    schema = {"type": "object", "required": ["units"], "properties": {"units": {"type": "string"}},
              "oneOf": [{"properties": {"shape": {"enum": ["square"]}, "side": {"type": "number"}}},
                        {"properties": {"shape": {"enum": ["circle"]}, "r": {"type": "number"}}},
                        {"properties": {"shape": {"const": "dot"}}}]}  # fmt: skip
    compiled = compiler.compile(GrammarSpec("json_schema", json.dumps(schema)), "llguidance")
    good = ['{"units":"m","shape":"square","side":2}', '{"units":"m","shape":"dot"}']
    bad = ['{"units":"m"}', '{"units":"m","shape":"circle","r":"x"}', '{"shape":"dot"}']
    assert_enforced(compiled, hf_tokenizer, schema, good, bad)


def test_llguidance_enforces_overlapping_branches_each_without_the_other(compiler, hf_tokenizer):
    # {} and {"dog": "rex", "cat": "tom"} match both branches: neither is taken
    schema = {"type": "object", "oneOf": [{"properties": {"dog": {"type": "string"}}},
                                          {"properties": {"cat": {"type": "string"}}}]}  # fmt: skip
    compiled = compiler.compile(GrammarSpec("json_schema", json.dumps(schema)), "llguidance")
    good = ['{"dog":"rex","cat":1}', '{"cat":"tom","dog":null}']
    bad = ["{}", '{"dog":"rex"}', '{"dog":"rex","cat":"tom"}', '{"dog":1,"cat":2}']
    assert_enforced(compiled, hf_tokenizer, schema, good, bad)


def test_llguidance_enforces_strings_told_apart_by_a_needed_character(compiler, hf_tokenizer):
    schema = {"oneOf": [{"type": "string", "pattern": "^[0-9a-z_-]{1,255}$"},
                        {"type": "string", "pattern": ".*\\{\\{.+}}.*"}]}  # fmt: skip
    compiled = compiler.compile(GrammarSpec("json_schema", json.dumps(schema)), "llguidance")
    good = ['"tag_1"', '"x{{y}}"', '"{{a}}"']
    bad = ['"A b"', '"{{}}"', "1"]
    assert_enforced(compiled, hf_tokenizer, schema, good, bad)


def test_llguidance_enforces_a_one_of_narrowed_by_its_finite_branch(compiler, hf_tokenizer):
    schema = {"type": "string", "oneOf": [{"enum": ["window", "tab"]}, {"maxLength": 3}]}
    compiled = compiler.compile(GrammarSpec("json_schema", json.dumps(schema)), "llguidance")
    # tab matches both; abcd neither
    assert_enforced(compiled, hf_tokenizer, schema, ['"window"', '"ab"', '""'], ['"tab"', '"abcd"'])


def test_llguidance_enforces_declared_properties_beside_a_pattern_of_every_name(
    compiler, hf_tokenizer
):
    # a recursive $ref both under a declared name and under a pattern matching it too
    # (llguidance refused the intersection: "circular references with sibling keys")
    node = {
        "type": "object",
        "properties": {
            "kids": {"type": "array", "title": "Kids", "items": {"$ref": "#/$defs/node"}},
            "n": {"type": "integer"},
        },
        "patternProperties": {"^[a-z]*": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
    }
    schema = {"$defs": {"node": node}, "$ref": "#/$defs/node"}  # fmt: skip
    compiled = compiler.compile(GrammarSpec("json_schema", json.dumps(schema)), "llguidance")
    # n: an integer and an array
    assert_enforced(
        compiled,
        hf_tokenizer,
        schema,
        ['{"kids":[{}]}', '{"x":[{"kids":[]}]}', "{}"],
        ['{"kids":1}', '{"x":[1]}', '{"n":1}', '{"n":[]}'],
    )


@pytest.mark.parametrize(
    ("pattern", "starts"),
    [
        ("^\\$[A-Z]+", "$"),
        ("^[a-c_]x", "abc_"),
        ("^[\\-.]{2}", "-."),
        ("^x+$", "x"),
        ("^x*", None),  # may be empty
        ("^x{0,2}", None),
        ("^[^a]", None),  # negated
        ("^\\d", None),  # a class escape
        ("^a|b", None),  # an alternative
        ("a", None),  # unanchored
    ],
)
def test_first_characters_of_a_pattern(pattern, starts):
    found = _facts().first_characters({"type": "string", "pattern": pattern})
    assert found == (frozenset(starts) if starts is not None else None)


def test_llguidance_enforces_strings_told_apart_by_their_first_character(compiler, hf_tokenizer):
    schema = {"type": "object", "properties": {"key": {"oneOf": [{"format": "uuid"},
              {"pattern": "^\\$[A-Z0-9-_]+"}]}}, "required": ["key"]}  # fmt: skip
    compiled = compiler.compile(GrammarSpec("json_schema", json.dumps(schema)), "llguidance")
    # 1 and null match both
    assert_enforced(
        compiled,
        hf_tokenizer,
        schema,
        [f'{{"key":"{UUID}"}}', '{"key":"$AB"}'],
        ['{"key":1}', '{"key":"AB"}', '{"key":null}'],
    )


def test_equal_numbers_are_one_value_whatever_their_spelling():
    assert not _facts().told_apart({"enum": [1, "a"]}, {"const": 1.0}, {})
    assert _facts().told_apart({"const": True}, {"const": 1}, {})


IMPLY_DEFS = {
    "node": {"type": "object", "properties": {"kids": {"type": "array",
             "items": {"$ref": "#/$defs/node"}}, "name": {"type": "string"}}},
    "leaf": {"type": "object", "additionalProperties": False, "required": ["name"],
             "properties": {"name": {"enum": ["a", "b"]},
                            "kids": {"type": "array", "maxItems": 0}}},
    "loose": {"type": "object", "properties": {"kids": {"maxItems": 0}}},  # kids: any type
}  # fmt: skip


@pytest.mark.parametrize(
    ("a", "b", "implied"),
    [
        ({"$ref": "#/$defs/node"}, {"$ref": "#/$defs/node", "title": "same"}, True),
        ({"$ref": "#/$defs/leaf"}, {"$ref": "#/$defs/node"}, True),  # through the recursion
        ({"$ref": "#/$defs/node"}, {"$ref": "#/$defs/leaf"}, False),
        ({"$ref": "#/$defs/loose"}, {"$ref": "#/$defs/node"}, False),  # "kids": "s" passes
        (
            {"type": "array", "maxItems": 1, "items": {"$ref": "#/$defs/leaf"}},
            {"type": "array", "items": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/node"}]}},
            True,
        ),  # fmt: skip
        ({"type": "array", "maxItems": 1}, {"type": "array", "maxItems": 2}, True),
        ({"type": "array", "maxItems": 3}, {"type": "array", "maxItems": 2}, False),
        ({"type": "string"}, {"type": "string", "maxLength": 3}, False),
        ({"enum": ["ab", "c"]}, {"type": "string", "maxLength": 3}, True),
        ({"type": "integer"}, {"type": "number", "required": ["x"]}, True),  # not an object
        ({"type": "object"}, {"type": "object", "required": ["x"]}, False),
        ({}, {"type": "string"}, False),
        (False, {"type": "string"}, True),
    ],
    ids=lambda v: json.dumps(v)[:50],
)
def test_implies_only_where_every_value_of_one_passes_the_other(a, b, implied):
    facts = SchemaFacts({"$defs": IMPLY_DEFS}, VOCABULARY | {"maxItems", "maxLength", "items"})
    assert facts.implies(a, b) is implied
    values = [*VALUES, {"name": "a"}, {"name": "a", "kids": []}, {"name": "c"}, [{"name": "a"}],
              [None], [{"name": "a"}, {"name": "b"}], [1], "abcd"]  # fmt: skip
    if implied:  # checked over values: none a takes that b refuses
        for value in values:
            if a is not False and _valid(a, value, IMPLY_DEFS):
                assert _valid(b, value, IMPLY_DEFS), value
