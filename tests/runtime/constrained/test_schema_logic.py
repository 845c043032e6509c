"""``schema_logic``: each rewrite accepts exactly the values the original does (checked
with jsonschema over a sample of values that probe every branch), and llguidance
enforces the rewritten if / then / else."""

from __future__ import annotations

import json

import jsonschema
import pytest

from radixlm.runtime.constrained import GrammarSpec
from radixlm.runtime.constrained.schema_logic import (
    conditional,
    discriminator_table,
    negation,
)
from tests.runtime.constrained.conftest import assert_enforced

SCALARS = [
    None, True, False, 0, 1, 1.0, 1.5, -2, 3, 10**6, "", "a", "ab", "abc", "abd", "b", "A",
    "a\n", "a]", "^", "x-y", "kind", [], [1], {}, {"a": 1},
]  # fmt: skip
OBJECTS = [
    {}, {"kind": "cat"}, {"kind": "dog"}, {"kind": "cow"}, {"kind": 1}, {"kind": "cat", "meow": 1},
    {"kind": "dog", "bark": 1}, {"kind": "dog", "meow": 1}, {"meow": 1}, {"bark": 1},
    {"meow": 1, "bark": 1}, {"kind": "cow", "moo": 1}, {"kind": "cow", "meow": 1}, "cat", 3, None,
]  # fmt: skip


def _valid(schema, value) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(value)


@pytest.mark.parametrize(
    "sub",
    [
        {"const": "abc"},
        {"enum": ["abc", "abd", "b", ""]},
        {"enum": ["a]", "^", "x-y"]},
        {"const": 1},
        {"enum": [1, 3, 1.5]},
        {"const": True},
        {"enum": [None, False, "a"]},
        {"type": "string"},
        {"type": ["object", "array"]},
        {"required": ["a"]},
        {"properties": {"a": {"const": 1}}},
        {"properties": {"a": {"enum": [1, 2]}}, "required": ["a"]},
        {"type": "string", "enum": ["a", "b"]},
        {"pattern": "^[a-c]+$"},
        {"pattern": "^[^b]{1,2}$"},
        {"type": "string", "pattern": "^a*$"},
        {"pattern": "^\\^?$"},
        {"allOf": [{"required": ["a"]}, {"required": ["kind"]}]},
        {"allOf": [{"type": "string"}, {"pattern": "^[a-z]{2}$"}]},
        {"anyOf": [{"required": ["a"]}, {"required": ["kind"]}]},
        {"anyOf": [{"type": "string"}, {"const": 1}]},
        {"anyOf": [{"required": ["a"]}, True]},
        {"minimum": 3},
        {"maximum": 1},
        {"exclusiveMinimum": 1},
        {"exclusiveMaximum": 1.5},
        {"minLength": 2},
        {"minLength": 0},
        {"maxLength": 1},
        {"minItems": 1},
        {"maxItems": 0},
        {"minProperties": 1},
        {"maxProperties": 0},
        {"allOf": [{"required": ["a"]}, {"minimum": 3}]},
        {"pattern": "^abc$"},
        {"pattern": "^x\\-y$"},
        {"oneOf": [{"pattern": "^ab$"}]},
        {"properties": {"kind": {"oneOf": [{"pattern": "^cat$"}]}}},
        True,
        False,
    ],
    ids=json.dumps,
)
def test_negation_accepts_exactly_what_the_subschema_refuses(sub):
    negated = negation(sub)
    assert negated is not None
    for value in [*SCALARS, *OBJECTS]:
        assert _valid(negated, value) != _valid(_ecma_ends(sub), value), value


def _ecma_ends(schema):
    """``schema`` with each pattern's final $ as \\Z: a regex's $ ends the string in
    ECMA 262 (JSON Schema's dialect), but Python's also matches before a final newline."""
    if isinstance(schema, dict):
        out = {k: _ecma_ends(v) for k, v in schema.items()}
        if isinstance(out.get("pattern"), str) and out["pattern"].endswith("$"):
            out["pattern"] = out["pattern"][:-1] + "\\Z"
        return out
    if isinstance(schema, list):
        return [_ecma_ends(v) for v in schema]
    return schema


@pytest.mark.parametrize(
    "sub",
    [
        {"pattern": "^a"},
        {"pattern": "^(ab)+$"},
        {"pattern": "^\\d+$"},
        {"enum": [{"a": 1}]},
        {"type": "integer"},
        {"multipleOf": 2},
        {"anyOf": [{"required": ["a"]}, {"multipleOf": 2}]},
        {"oneOf": [{"const": 1}, {"const": 2}]},
    ],
    ids=json.dumps,
)
def test_negation_of_other_forms_is_none(sub):
    assert negation(sub) is None


def test_conditional_is_if_then_else():
    if_ = {"properties": {"kind": {"const": "cat"}}}
    then = {"required": ["meow"]}
    else_ = {"not": {"required": ["meow"]}}
    original = {"if": if_, "then": then, "else": else_}
    rewritten = conditional(if_, then, else_)
    for value in OBJECTS:
        assert _valid(rewritten, value) == _valid(original, value), value


def test_discriminator_table_reads_every_if_at_once():
    members = [
        {"if": {"properties": {"kind": {"const": "cat"}}}, "then": {"required": ["meow"]}},
        {"if": {"properties": {"kind": {"const": "dog"}}}, "then": {"required": ["bark"]},
         "else": {"properties": {"bark": False}}},
        {"type": "object"},
    ]  # fmt: skip
    rest, table = discriminator_table(members)
    assert rest == [{"type": "object"}]
    for value in OBJECTS:
        assert _valid({"allOf": [*rest, table]}, value) == _valid({"allOf": members}, value), value


def test_one_if_is_no_table():
    assert discriminator_table([{"if": {"properties": {"k": {"const": 1}}}, "then": {}}]) is None


@pytest.mark.parametrize(
    ("schema", "good", "bad"),
    [
        (  # a discriminator table on an object's kind
            {
                "type": "object",
                "properties": {"kind": {"enum": ["cat", "dog"]}, "n": {"type": "integer"}},
                "required": ["kind"],
                "allOf": [
                    {
                        "if": {"properties": {"kind": {"const": "cat"}}},
                        "then": {"properties": {"n": {"maximum": 9}}},
                    },
                    {"if": {"properties": {"kind": {"const": "dog"}}}, "then": {"required": ["n"]}},
                ],
            },  # fmt: skip
            ['{"kind":"cat","n":9}', '{"kind":"dog","n":99}', '{"kind":"cat"}'],
            ['{"kind":"cat","n":10}', '{"kind":"dog"}'],
        ),
        (  # one if with an else, testing a string against a const
            {
                "type": "object",
                "properties": {"k": {"type": "string"}, "v": {"type": "integer"}},
                "required": ["k"],
                "if": {"properties": {"k": {"const": "x"}}},
                "then": {"required": ["v"]},
                "else": {"properties": {"v": False}},
            },
            ['{"k":"x","v":1}', '{"k":"y"}', '{"k":"xy"}', '{"k":""}'],
            ['{"k":"x"}', '{"k":"y","v":1}', '{"k":"xx","v":2}'],
        ),
    ],
)
def test_llguidance_enforces_if_then_else(compiler, hf_tokenizer, schema, good, bad):
    compiled = compiler.compile(GrammarSpec("json_schema", json.dumps(schema)), "llguidance")
    assert_enforced(compiled, hf_tokenizer, schema, good, bad)


def test_llguidance_enforces_not_over_a_repeated_class(compiler, hf_tokenizer):
    # a name that is not only punctuation and spaces (a real-world schema's form)
    schema = {"type": "string", "minLength": 1, "not": {"pattern": "^[\\.\\,\\-\\s]+$"}}
    compiled = compiler.compile(GrammarSpec("json_schema", json.dumps(schema)), "llguidance")
    assert_enforced(
        compiled, hf_tokenizer, schema, ['"a"', '" a."', '"-x-"'], ['""', '" "', '".,-"', '"  .  "']
    )


def test_llguidance_enforces_not_over_an_any_of_and_a_bound(compiler, hf_tokenizer):
    # a service with an image may not also say how to build one (compose files' form)
    schema = {
        "type": "object",
        "properties": {"image": {"type": "string"}, "build": {}, "dockerfile": {}, "n": {}},
        "oneOf": [{"required": ["build"]}, {"required": ["image"]}],
        "if": {"required": ["image"]},
        "then": {"not": {"anyOf": [{"required": ["build"]}, {"required": ["dockerfile"]}]}},
        "not": {"properties": {"n": {"minimum": 3}}, "required": ["n"]},
    }
    compiled = compiler.compile(GrammarSpec("json_schema", json.dumps(schema)), "llguidance")
    assert_enforced(
        compiled,
        hf_tokenizer,
        schema,
        ['{"image":"a"}', '{"build":1,"dockerfile":"x"}', '{"image":"a","n":2}'],
        ['{"image":"a","dockerfile":"x"}', '{"image":"a","n":3}', '{"n":1}'],
    )
