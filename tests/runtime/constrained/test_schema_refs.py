"""``schema_refs``: references into rewritten places are hoisted, and a reference with
sibling keywords in a recursive schema becomes one llguidance compiles, each keeping the
schema's meaning (checked with jsonschema, then through llguidance)."""

from __future__ import annotations

import json

import jsonschema

from radixlm.runtime.constrained import GrammarSpec
from radixlm.runtime.constrained.schema_refs import (
    hoist_refs,
    inline_recursive_refs,
    resolve_pointer,
)
from tests.runtime.constrained.conftest import accepts_text

# A tree whose children are trees without an "x" (a $ref with a sibling, on a cycle).
TREE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "x": {"type": "integer"},
                "kids": {
                    "type": "array",
                    "items": {"$ref": "#/$defs/node", "properties": {"x": False}},
                },
            },
            "additionalProperties": False,
        }
    },
    "$ref": "#/$defs/node",
}
TREES = [
    {"name": "a"},
    {"x": 1},
    {"kids": [{"name": "b"}]},
    {"kids": [{"x": 2}]},
    {"kids": [{"kids": [{"x": 3}]}]},
    {"x": 4, "kids": [{"kids": [{"name": "c"}]}]},  # in declared order, as llguidance writes
    {"y": 1},
    "leaf",
]


def _valid(schema, value) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(value)


def test_inner_references_are_hoisted_into_definitions():
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer", "minimum": 3}, "b": {"$ref": "#/properties/a"}},
    }
    out = hoist_refs(schema)
    assert out["properties"]["b"] == {"$ref": "#/$defs/radixlm_ref_0"}
    assert out["$defs"]["radixlm_ref_0"] == {"type": "integer", "minimum": 3}
    assert schema["properties"]["b"] == {"$ref": "#/properties/a"}  # not modified
    for value in [{"b": 3}, {"b": 2}, {"a": 1}, {"b": "x"}]:
        assert _valid(out, value) == _valid(schema, value)


def test_definition_references_stay():
    schema = {"definitions": {"n": {"type": "integer"}}, "items": {"$ref": "#/definitions/n"}}
    assert hoist_refs(schema) is schema


def test_recursive_reference_siblings_are_inlined():
    out = inline_recursive_refs(json.loads(json.dumps(TREE)))
    items = out["$defs"]["node"]["properties"]["kids"]["items"]
    assert set(items) == {"$ref"}
    for value in TREES:
        assert _valid(out, value) == _valid(TREE, value), value


def test_acyclic_schemas_are_left_alone():
    schema = {"$defs": {"n": {"type": "object"}}, "items": {"$ref": "#/$defs/n", "required": ["a"]}}
    assert inline_recursive_refs(json.loads(json.dumps(schema))) == schema


def test_llguidance_compiles_a_recursive_reference_with_siblings(compiler, hf_tokenizer):
    compiled = compiler.compile(GrammarSpec("json_schema", json.dumps(TREE)), "llguidance")
    for value in TREES:
        text = json.dumps(value, separators=(",", ":"))
        assert accepts_text(compiled, hf_tokenizer, text) == _valid(TREE, value), text


def test_an_any_of_beside_keywords_over_a_cycle_compiles(compiler, hf_tokenizer):
    """The keywords beside the anyOf go into its branches (llguidance would put them
    beside each branch's reference, where it refuses them)."""
    schema = {
        "type": "object",
        "anyOf": [{"$ref": "#/definitions/list"}, {"$ref": "#/definitions/text"}],
        "definitions": {
            "list": {
                "type": "object",
                "properties": {"type": {"const": "list"}, "items": {"items": {"$ref": "#"}}},
                "required": ["type"],
                "additionalProperties": False,
            },
            "text": {
                "type": "object",
                "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
                "required": ["type", "text"],
                "additionalProperties": False,
            },
        },
    }
    compiled = compiler.compile(GrammarSpec("json_schema", json.dumps(schema)), "llguidance")
    good = '{"type":"list","items":[{"type":"text","text":"a"},{"type":"list"}]}'
    assert accepts_text(compiled, hf_tokenizer, good)
    assert not accepts_text(compiled, hf_tokenizer, '{"type":"list","items":[{"type":"text"}]}')


def test_an_all_of_member_referring_into_a_cycle_compiles(compiler, hf_tokenizer):
    """A source map's sections: each a map (which may hold sections) and an offset; the
    reference, an allOf member, is lifted beside the rest and inlined once."""
    schema = {
        "definitions": {
            "map": {"anyOf": [{"properties": {"url": {"type": "string"}}},
                              {"properties": {"map": {"$ref": "#"}}}]},
        },
        "type": "object",
        "properties": {"sections": {"type": "array", "items": {"allOf": [
            {"$ref": "#/definitions/map"},
            {"type": "object", "properties": {"offset": {"type": "integer"}}},
        ]}}},
    }  # fmt: skip
    out = inline_recursive_refs(json.loads(json.dumps(schema)))
    assert "allOf" not in json.dumps(out["properties"]["sections"]["items"])
    compiled = compiler.compile(GrammarSpec("json_schema", json.dumps(schema)), "llguidance")
    good = [{"sections": [{"offset": 1, "url": "u"}]},
            {"sections": [{"map": {"sections": [{"offset": 2}]}}]}]  # fmt: skip
    bad = [{"sections": [{"offset": "x"}]}, {"sections": [1]}, {"sections": {}}]
    for value in good + bad:
        text = json.dumps(value, separators=(",", ":"))
        assert accepts_text(compiled, hf_tokenizer, text) == _valid(schema, value), text
    assert all(_valid(schema, v) for v in good) and not any(_valid(schema, v) for v in bad)


def test_a_percent_encoded_pointer_is_decoded(compiler, hf_tokenizer):
    # a pattern property's name in a URI fragment: [-_.a-z]+ spelled %5B-_.a-z%5D%2B
    name = {"type": "string", "maxLength": 3}
    schema = {"type": "object", "patternProperties": {"[-_.a-z]+": name},
              "properties": {"alias": {"$ref": "#/patternProperties/%5B-_.a-z%5D%2B"}}}  # fmt: skip
    assert resolve_pointer(schema, "/patternProperties/%5B-_.a-z%5D%2B") == name
    assert resolve_pointer({"a/b": 1, "50%": 2}, "/a~1b") == 1
    assert resolve_pointer({"50%": 2}, "/50%25") == 2
    compiled = compiler.compile(GrammarSpec("json_schema", json.dumps(schema)), "llguidance")
    for text, valid in (('{"alias":"abc"}', True), ('{"alias":"abcd"}', False)):
        assert accepts_text(compiled, hf_tokenizer, text) is valid
        assert _valid(schema, json.loads(text)) is valid
