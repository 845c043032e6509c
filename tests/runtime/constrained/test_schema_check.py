"""The keyword tables are measured facts: every keyword a backend claims to enforce
must refuse a violating value through that backend, and every constraint keyword it
does not claim is rejected by name."""

from __future__ import annotations

import json

import jsonschema
import pytest

from radixlm.runtime.constrained import GrammarSpec
from radixlm.runtime.constrained.schema_check import ENFORCED_FORMATS, ENFORCED_KEYWORDS
from radixlm.runtime.errors import GrammarError, UnsupportedGrammarError
from tests.runtime.constrained.conftest import accepts_text

OBJ = {"type": "object", "additionalProperties": False}
# keyword -> (schema using it, a value it accepts, a value only the keyword refuses)
PROBES = {
    "type": ({"type": "integer"}, "3", '"3"'),
    "properties": ({**OBJ, "properties": {"a": {"type": "integer"}}}, '{"a":1}', '{"a":"x"}'),
    "required": ({**OBJ, "properties": {"a": {"type": "integer"}}, "required": ["a"]}, '{"a":1}',
                 "{}"),
    "additionalProperties": ({**OBJ, "properties": {"a": {"type": "integer"}}}, '{"a":1}',
                             '{"a":1,"b":2}'),
    "items": ({"type": "array", "items": {"type": "integer"}}, "[1,2]", '[1,"a"]'),
    "prefixItems": ({"type": "array", "prefixItems": [{"type": "integer"}], "items": False},
                    "[1]", "[1,2]"),
    "minItems": ({"type": "array", "items": {"type": "integer"}, "minItems": 2}, "[1,2]", "[1]"),
    "maxItems": ({"type": "array", "items": {"type": "integer"}, "maxItems": 1}, "[1]", "[1,2]"),
    "enum": ({"enum": ["a", 1]}, "1", '"b"'),
    "const": ({"const": "a"}, '"a"', '"b"'),
    "anyOf": ({"anyOf": [{"type": "integer"}, {"type": "null"}]}, "null", "true"),
    "$ref": ({"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n"}, "1", '"a"'),
    "$defs": ({"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n"}, "1", '"a"'),
    "definitions": ({"definitions": {"n": {"type": "integer"}}, "$ref": "#/definitions/n"}, "1",
                    '"a"'),
    "minLength": ({"type": "string", "minLength": 2}, '"ab"', '"a"'),
    "maxLength": ({"type": "string", "maxLength": 2}, '"ab"', '"abc"'),
    "pattern": ({"type": "string", "pattern": "^[a-c]+$"}, '"ab"', '"ad"'),
    "format": ({"type": "string", "format": "uuid"}, '"123e4567-e89b-12d3-a456-426614174000"',
               '"123e4567"'),
    "minProperties": ({"type": "object", "additionalProperties": {"type": "integer"},
                       "minProperties": 1}, '{"a":1}', "{}"),
    "maxProperties": ({"type": "object", "additionalProperties": {"type": "integer"},
                       "maxProperties": 1}, '{"a":1}', '{"a":1,"b":2}'),
    "minimum": ({"type": "integer", "minimum": 5}, "5", "4"),
    "maximum": ({"type": "integer", "maximum": 5}, "5", "6"),
    "exclusiveMinimum": ({"type": "integer", "exclusiveMinimum": 5}, "6", "5"),
    "exclusiveMaximum": ({"type": "integer", "exclusiveMaximum": 5}, "4", "5"),
    "multipleOf": ({"type": "integer", "multipleOf": 5}, "10", "7"),
    "patternProperties": ({**OBJ, "patternProperties": {"^x": {"type": "integer"}}}, '{"x":1}',
                          '{"y":1}'),
    "propertyNames": ({"type": "object", "propertyNames": {"pattern": "^x"},
                       "additionalProperties": {"type": "integer"}}, '{"x":1}', '{"y":1}'),
}  # fmt: skip
FORMAT_PROBES = {
    "email": ('"a@b.co"', '"ab"'),
    "date": ('"2024-01-02"', '"2024-1-2"'),
    "date-time": ('"2024-01-02T03:04:05Z"', '"2024-01-02"'),
    "time": ('"03:04:05Z"', '"3"'),
    "uuid": ('"123e4567-e89b-12d3-a456-426614174000"', '"123"'),
    "ipv4": ('"1.2.3.4"', '"1.2.3"'),
    "uri": ('"http://a.b"', '"nope"'),
}
# constraint keywords neither backend enforces, with a valid value each
UNENFORCED = {
    "uniqueItems": True,
    "contains": {"const": 1},
    "oneOf": [{"type": "integer"}],
    "allOf": [{"type": "integer"}],
    "not": {"type": "string"},
    "if": {"type": "integer"},
    "dependentRequired": {"a": ["b"]},
}
PAIRS = [(b, k) for b in ENFORCED_KEYWORDS for k in sorted(ENFORCED_KEYWORDS[b])]


def test_every_enforced_keyword_has_a_probe():
    assert set().union(*ENFORCED_KEYWORDS.values()) <= PROBES.keys()
    assert set().union(*ENFORCED_FORMATS.values()) <= FORMAT_PROBES.keys()


@pytest.mark.parametrize(("backend", "keyword"), PAIRS)
def test_enforced_keywords_refuse_violations(compiler, hf_tokenizer, backend, keyword):
    schema, good, bad = PROBES[keyword]
    compiled = compiler.compile(GrammarSpec("json_schema", json.dumps(schema)), backend)
    assert accepts_text(compiled, hf_tokenizer, good)
    assert not accepts_text(compiled, hf_tokenizer, bad)


@pytest.mark.parametrize(
    ("backend", "fmt"), [(b, f) for b in ENFORCED_FORMATS for f in sorted(ENFORCED_FORMATS[b])]
)
def test_enforced_formats_refuse_violations(compiler, hf_tokenizer, backend, fmt):
    good, bad = FORMAT_PROBES[fmt]
    schema = json.dumps({"type": "string", "format": fmt})
    compiled = compiler.compile(GrammarSpec("json_schema", schema), backend)
    assert accepts_text(compiled, hf_tokenizer, good)
    assert not accepts_text(compiled, hf_tokenizer, bad)


@pytest.mark.parametrize("backend", ["outlines", "xgrammar"])
@pytest.mark.parametrize(
    "keyword",
    sorted(set(PROBES) - ENFORCED_KEYWORDS["outlines"]) + sorted(UNENFORCED),
)
def test_unenforced_keywords_are_rejected_by_name(compiler, backend, keyword):
    if keyword in ENFORCED_KEYWORDS[backend]:
        pytest.skip(f"{backend} enforces {keyword}")
    inner = {**PROBES[keyword][0]} if keyword in PROBES else {keyword: UNENFORCED[keyword]}
    schema = {"type": "object", "properties": {"deep": {"type": "array", "items": inner}}}
    with pytest.raises(UnsupportedGrammarError, match=rf"{keyword} at #/properties/deep/items"):
        compiler.compile(GrammarSpec("json_schema", json.dumps(schema)), backend)


def test_the_other_backend_is_suggested(compiler):
    schema = json.dumps({"type": "integer", "minimum": 1})
    with pytest.raises(UnsupportedGrammarError, match="grammar_backend='xgrammar'"):
        compiler.compile(GrammarSpec("json_schema", schema), "outlines")


@pytest.mark.parametrize("backend", ["outlines", "xgrammar"])
@pytest.mark.parametrize(
    "extra", [{"format": "email"}, {"maxLength": 3}, {"minLength": 1}], ids=str
)
def test_string_keywords_a_backend_would_drop_together_are_rejected(compiler, backend, extra):
    schema = json.dumps({"type": "string", "pattern": "^[a-z]+$", **extra})
    with pytest.raises(UnsupportedGrammarError, match="together at #"):
        compiler.compile(GrammarSpec("json_schema", schema), backend)


@pytest.mark.parametrize("backend", ["outlines", "xgrammar"])
def test_annotations_and_unknown_keywords_are_ignored(compiler, hf_tokenizer, backend):
    # What real-world schemas carry besides constraints (JSONSchemaBench's most common
    # "unsupported" keywords were these): the specification makes them annotations.
    noise = {"title": "N", "description": "d", "examples": [1], "default": 1, "$comment": "x",
             "readOnly": True, "readonly": True, "id": "urn:x", "self": {"href": "/x"},
             "x-kubernetes-group-version-kind": [{"kind": "X"}], "_format": "int",
             "faker": "number", "optional": True, "nullable": False, "links": []}  # fmt: skip
    inner = {"type": "integer", "maximum": 50, **noise} if backend == "xgrammar" else {
        "type": "integer", **noise}
    schema = {"type": "object", "properties": {"n": inner}, "required": ["n"],
              "additionalProperties": False, **noise}  # fmt: skip
    compiled = compiler.compile(GrammarSpec("json_schema", json.dumps(schema)), backend)
    assert accepts_text(compiled, hf_tokenizer, '{"n":12}')
    assert not accepts_text(compiled, hf_tokenizer, '{"n":"12"}')


def test_too_deep_a_schema_is_rejected(compiler):
    schema: dict = {"type": "integer"}
    for _ in range(30):
        schema = {"type": "array", "items": schema}
    with pytest.raises(GrammarError, match="deeper than 24"):
        compiler.compile(GrammarSpec("json_schema", json.dumps(schema)), "xgrammar")


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "minimum": 3, "exclusiveMaximum": 3},
        {"type": "array", "minItems": 3, "maxItems": 1},
        {**OBJ, "properties": {"a": {"type": "integer"}}, "required": ["b"]},
    ],
    ids=["range", "items", "required"],
)
def test_self_contradicting_schemas_accept_nothing(compiler, schema):
    with pytest.raises(GrammarError, match="accepts nothing"):
        compiler.compile(GrammarSpec("json_schema", json.dumps(schema)), "xgrammar")


DRAFT_04 = "http://json-schema.org/draft-04/schema#"
DRAFT_07 = "http://json-schema.org/draft-07/schema#"


@pytest.mark.parametrize(
    ("schema", "accepted", "refused"),
    [
        # draft-04: exclusiveMinimum / exclusiveMaximum are flags on minimum / maximum
        ({"$schema": DRAFT_04, "type": "integer", "minimum": 5, "exclusiveMinimum": True,
          "maximum": 9, "exclusiveMaximum": False}, ["6", "9"], ["5", "10"]),
        # up to 2019-09: array-form items is a tuple, additionalItems the rest
        ({"$schema": DRAFT_07, "type": "array", "items": [{"type": "integer"},
          {"type": "string"}], "additionalItems": False}, ['[1,"a"]'], ['[1,"a",2]', '["a",1]']),
        ({"$schema": DRAFT_04, "type": "array", "items": [{"type": "integer"}],
          "additionalItems": {"type": "boolean"}}, ["[1,true,false]"], ["[1,2]"]),
    ],
)  # fmt: skip
def test_older_drafts_are_read_in_their_own_meaning(
    compiler, hf_tokenizer, schema, accepted, refused
):
    compiled = compiler.compile(GrammarSpec("json_schema", json.dumps(schema)), "xgrammar")
    validator = jsonschema.validators.validator_for(schema)(schema)
    for text in accepted:
        assert validator.is_valid(json.loads(text)) and accepts_text(compiled, hf_tokenizer, text)
    for text in refused:
        assert not validator.is_valid(json.loads(text))
        assert not accepts_text(compiled, hf_tokenizer, text)


def test_a_draft_04_schema_is_checked_against_its_own_meta_schema(compiler):
    bad = {"$schema": DRAFT_04, "type": "integer", "exclusiveMinimum": 5}  # a number: 2020-12's
    with pytest.raises(GrammarError, match="not a valid JSON Schema"):
        compiler.compile(GrammarSpec("json_schema", json.dumps(bad)), "xgrammar")
