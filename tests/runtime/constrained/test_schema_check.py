"""The keyword tables are measured facts: every keyword a backend claims to enforce
must refuse a violating value through that backend, and every constraint keyword it
does not claim is rejected by name."""

from __future__ import annotations

import json

import jsonschema
import pytest

from radixlm.runtime.constrained import GrammarSpec
from radixlm.runtime.constrained.registry import REGISTRY
from radixlm.runtime.errors import GrammarError, UnsupportedGrammarError
from tests.runtime.constrained.conftest import accepts_text

# The capability tables, as the registry's entries give them.
ENFORCED_KEYWORDS = {e.name: e.json_schema.keywords for e in REGISTRY.entries() if e.json_schema}
ENFORCED_FORMATS = {e.name: e.json_schema.formats for e in REGISTRY.entries() if e.json_schema}
OBJ = {"type": "object", "additionalProperties": False}
AB = {**OBJ, "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
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
    "allOf": ({"allOf": [{"type": "string"}, {"maxLength": 2}]}, '"ab"', '"abc"'),
    # told apart by required properties only: llguidance sees it once each forbids the other's
    "oneOf": ({**AB, "oneOf": [{"required": ["a"]}, {"required": ["b"]}]}, '{"a":1}',
              '{"a":1,"b":2}'),
    "dependentRequired": ({**AB, "dependentRequired": {"a": ["b"]}}, '{"a":1,"b":2}', '{"a":1}'),
    "dependentSchemas": ({**AB, "dependentSchemas": {"a": {"required": ["b"]}}}, '{"a":1,"b":2}',
                         '{"a":1}'),
    "not": ({**AB, "not": {"required": ["a", "b"]}}, '{"a":1}', '{"a":1,"b":2}'),
    "if": ({**AB, "if": {"properties": {"a": {"const": 1}}}, "then": {"required": ["b"]}},
           '{"a":1,"b":2}', '{"a":1}'),
    "then": ({**AB, "if": {"properties": {"a": {"const": 1}}}, "then": {"required": ["b"]}},
             '{"a":2}', '{"a":1}'),
    "else": ({**AB, "if": {"properties": {"a": {"const": 1}}}, "then": {},
              "else": {"required": ["b"]}}, '{"a":2,"b":1}', '{"a":2}'),
    "uniqueItems": ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
                    "[1,12]", "[12,1,12]"),
}  # fmt: skip
FORMAT_PROBES = {
    "email": ('"a@b.co"', '"ab"'),
    "date": ('"2024-01-02"', '"2024-1-2"'),
    "date-time": ('"2024-01-02T03:04:05Z"', '"2024-01-02"'),
    "time": ('"03:04:05Z"', '"3"'),
    "uuid": ('"123e4567-e89b-12d3-a456-426614174000"', '"123"'),
    "ipv4": ('"1.2.3.4"', '"1.2.3"'),
    "uri": ('"http://a.b"', '"nope"'),
    "ipv6": ('"::1"', '"1.2.3.4"'),
    "hostname": ('"example.com"', '"a b"'),
    "duration": ('"P3D"', '"3 days"'),
    "uri-reference": ('"../a/b?c#d"', '"a b"'),
    "json-pointer": ('"/a~1b/0"', '"a/b"'),
    "relative-json-pointer": ('"1/a"', '"/a"'),
    "regex": ('"^a\\\\.b$"', '"a("'),
    "iri": ('"http://a.b"', '"nope"'),
    "iri-reference": ('"../a/b?c#d"', '"a b"'),
    "idn-email": ('"a@b.co"', '"ab"'),
}
# constraint keywords some backend does not enforce, with a valid value each
UNENFORCED = {
    "contains": {"const": 1},
    "oneOf": [{"type": "integer"}],
    "allOf": [{"type": "integer"}],
    "not": {"type": "string"},
    "if": {"type": "integer"},  # with a then: alone it is a no-op
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


@pytest.mark.parametrize("backend", sorted(ENFORCED_KEYWORDS))
@pytest.mark.parametrize(
    "keyword",
    # then / else are named with their if
    sorted(set(PROBES) - ENFORCED_KEYWORDS["outlines"] - {"then", "else"})
    + sorted(set(UNENFORCED) - set(PROBES)),
)
def test_unenforced_keywords_are_rejected_by_name(compiler, backend, keyword):
    if keyword in ENFORCED_KEYWORDS[backend]:
        pytest.skip(f"{backend} enforces {keyword}")
    inner = {**PROBES[keyword][0]} if keyword in PROBES else {keyword: UNENFORCED[keyword]}
    if keyword == "if":
        inner["then"] = {"type": "integer"}
    schema = {"type": "object", "properties": {"deep": {"type": "array", "items": inner}}}
    with pytest.raises(
        UnsupportedGrammarError, match=rf"{keyword}(, then)? at #/properties/deep/items"
    ):
        compiler.compile(GrammarSpec("json_schema", json.dumps(schema)), backend)


def test_the_other_backend_is_suggested(compiler):
    """The JSON-schema default first (llguidance), then the registry's order."""
    schema = json.dumps({"type": "integer", "minimum": 1})
    with pytest.raises(UnsupportedGrammarError, match="grammar_backend='llguidance'"):
        compiler.compile(GrammarSpec("json_schema", schema), "outlines")
    schema = json.dumps({"type": "string", "format": "ipv6"})
    with pytest.raises(UnsupportedGrammarError, match="grammar_backend='llguidance'"):
        compiler.compile(GrammarSpec("json_schema", schema), "xgrammar")


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
    inner = (
        {"type": "integer", "maximum": 50, **noise}
        if backend == "xgrammar"
        else {"type": "integer", **noise}
    )
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


def test_llguidance_reads_a_self_contradicting_subschema_as_false(compiler, hf_tokenizer):
    # "cr" can never be there (its object requires what it refuses); the rest is fine
    cr = {**OBJ, "properties": {"a": {}}, "required": ["b"]}
    schema = {**OBJ, "properties": {"n": {"type": "integer"}, "cr": cr}, "required": ["n"]}
    compiled = compiler.compile(GrammarSpec("json_schema", json.dumps(schema)), "llguidance")
    assert any("#/properties/cr accepts nothing" in w for w in compiled.warnings)
    _agrees_with_jsonschema(compiled, hf_tokenizer, schema, ['{"n":1}'], ['{"n":1,"cr":{"a":1}}'])
    required = {**schema, "required": ["n", "cr"]}
    with pytest.raises(GrammarError, match="accepts nothing"):
        compiler.compile(GrammarSpec("json_schema", json.dumps(required)), "llguidance")


def test_contradicting_keywords_of_other_types_refuse_only_those_types(compiler, hf_tokenizer):
    # an integer with object keywords that contradict (a closed object requiring what it
    # does not declare): they never apply to an integer, so it is an integer 1..3
    integer = {"type": "integer", "minimum": 1, "maximum": 3, "required": ["type"],
               "additionalProperties": False}  # fmt: skip
    compiled = compiler.compile(GrammarSpec("json_schema", json.dumps(integer)), "llguidance")
    _agrees_with_jsonschema(compiled, hf_tokenizer, integer, ["1", "3"], ["0", "{}", '"a"'])
    # no type: an empty numeric range refuses every number, and only numbers
    untyped = {"minimum": 5, "maximum": 1, "minLength": 1}
    compiled = compiler.compile(GrammarSpec("json_schema", json.dumps(untyped)), "llguidance")
    good, bad = ['"a"', "null", "[]", "true"], ["3", "5", '""']
    _agrees_with_jsonschema(compiled, hf_tokenizer, untyped, good, bad)


def test_a_list_of_repeated_values_is_read_once(compiler, hf_tokenizer):
    # a meta-schema error (enum items must be unique) that changes nothing: the same schema
    schema = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object",
              "properties": {"c": {"enum": ["GB", "FR", "GB", 1, 1.0]}},
              "required": ["c", "c"]}  # fmt: skip
    compiled = compiler.compile(GrammarSpec("json_schema", json.dumps(schema)), "llguidance")
    assert sorted(compiled.warnings) == [
        "#/properties/c/enum lists a value twice: read once",
        "#/required lists a value twice: read once",
    ]
    _agrees_with_jsonschema(compiled, hf_tokenizer, schema, ['{"c":"GB"}', '{"c":1}'],
                            ['{"c":"DE"}', "{}"])  # fmt: skip
    with pytest.raises(GrammarError, match="not a valid JSON Schema at properties/c/enum"):
        bad = {**schema, "properties": {"c": {"enum": "GB"}}}
        compiler.compile(GrammarSpec("json_schema", json.dumps(bad)), "llguidance")


def test_a_reference_to_a_definition_that_takes_nothing_reads_as_false(compiler, hf_tokenizer):
    # "disallowed" takes no value: a name it is given to may not be there (llguidance
    # refuses a reference to false, so the reference is replaced by false)
    everything = ["array", "boolean", "integer", "number", "null", "object", "string"]
    schema = {"definitions": {"disallowed": {"not": {"type": everything}},
                              "alias": {"$ref": "#/definitions/disallowed"}},
              "type": "object", "properties": {"old": {"$ref": "#/definitions/alias"}},
              "patternProperties": {
                  "_Localised$": {"$ref": "#/definitions/disallowed"}}}  # fmt: skip
    compiled = compiler.compile(GrammarSpec("json_schema", json.dumps(schema)), "llguidance")
    good, bad = ['{"a":1}', "{}"], ['{"old":1}', '{"Name_Localised":"x"}']
    _agrees_with_jsonschema(compiled, hf_tokenizer, schema, good, bad)
    required = {**schema, "required": ["old"]}
    with pytest.raises(GrammarError, match="accepts nothing"):
        compiler.compile(GrammarSpec("json_schema", json.dumps(required)), "llguidance")


def test_counted_properties_of_a_closed_object(compiler, hf_tokenizer):
    # no other property may be added: "at least 2" and "at most 1" read as which are there
    props = {name: {"type": "integer"} for name in ("a", "b", "c")}
    closed = {"type": "object", "properties": props, "additionalProperties": False}
    at_least = {**closed, "minProperties": 2}
    compiled = compiler.compile(GrammarSpec("json_schema", json.dumps(at_least)), "llguidance")
    good, bad = ['{"a":1,"b":2}', '{"a":1,"b":2,"c":3}'], ['{"a":1}', "{}"]
    _agrees_with_jsonschema(compiled, hf_tokenizer, at_least, good, bad)
    at_most = {**closed, "required": ["a"], "maxProperties": 2, "minProperties": 1}
    compiled = compiler.compile(GrammarSpec("json_schema", json.dumps(at_most)), "llguidance")
    good, bad = ['{"a":1}', '{"a":1,"c":3}'], ['{"a":1,"b":2,"c":3}', '{"b":2}']
    _agrees_with_jsonschema(compiled, hf_tokenizer, at_most, good, bad)


def test_a_pattern_of_one_name_another_pattern_matches(compiler, hf_tokenizer):
    # llguidance refuses overlapping pattern properties: ^_x$ becomes a declared property
    schema = {"type": "object", "additionalProperties": False, "patternProperties": {
        ".*": {"type": "string"}, "^_x$": {"maxLength": 2}}}  # fmt: skip
    compiled = compiler.compile(GrammarSpec("json_schema", json.dumps(schema)), "llguidance")
    good, bad = ['{"_x":"ab","y":"long"}'], ['{"_x":"abc"}', '{"_x":1}', '{"y":1}']
    _agrees_with_jsonschema(compiled, hf_tokenizer, schema, good, bad)


@pytest.mark.parametrize(
    ("pattern", "accepted", "refused"),
    [
        # an end anchor in a repeated group: each segment ends with / or the string
        ("^(\\/?(\\.{2}|[a-z0-9\\-]*)($|\\/))*$", ["", "a", "a/b", "/a/b/", "../x"],
         ["a//b/.", "A", "a/./b"]),
        ("^(\\/?([a-z]+)($|\\/))+$", ["a", "a/b", "/a/"], ["", "a//", "a/B"]),
        # \< and \> are < and > (ECMA-262's identity escapes), not word boundaries
        ("^.+\\<.+@.+\\..+\\>$", ["Ann <a@b.c>"], ["Ann a@b.c", "<a@b.c>"]),
    ],
)  # fmt: skip
def test_patterns_are_written_in_syntax_llguidance_reads(
    compiler, hf_tokenizer, pattern, accepted, refused
):
    schema = {"type": "string", "pattern": pattern}
    compiled = compiler.compile(GrammarSpec("json_schema", json.dumps(schema)), "llguidance")
    dump = json.dumps
    _agrees_with_jsonschema(compiled, hf_tokenizer, schema, map(dump, accepted), map(dump, refused))


def test_not_and_if_through_a_reference(compiler, hf_tokenizer):
    # not / if read the definition a $ref points at
    schema = {"definitions": {"primitive": {"enum": ["int", "string"]},
                              "named": {"type": "object", "required": ["name"]}},
              "type": "object", "properties": {
                  "custom": {"type": "string", "not": {"$ref": "#/definitions/primitive"}},
                  "v": {"if": {"$ref": "#/definitions/named"}, "then": {"maxProperties": 1},
                        "else": {"type": "integer"}}}}  # fmt: skip
    compiled = compiler.compile(GrammarSpec("json_schema", json.dumps(schema)), "llguidance")
    good = ['{"custom":"MyType"}', '{"v":{"name":"a"}}', '{"v":3}']
    bad = ['{"custom":"int"}', '{"v":{"name":"a","b":1}}', '{"v":"s"}']
    _agrees_with_jsonschema(compiled, hf_tokenizer, schema, good, bad)


def test_a_draft_04_definition_is_not_negated_in_2020_12_keywords(compiler):
    # draft-04 has no const: {"const": "x"} takes every value, so its negation takes none;
    # reading it as 2020-12 would let every value but "x" through: refused instead
    schema = {"$schema": "http://json-schema.org/draft-04/schema#",
              "definitions": {"x": {"const": "x"}}, "not": {"$ref": "#/definitions/x"}}  # fmt: skip
    with pytest.raises(UnsupportedGrammarError, match="not at #"):
        compiler.compile(GrammarSpec("json_schema", json.dumps(schema)), "llguidance")


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


def _compile(compiler, schema: dict, backend: str = "llguidance", lenient: bool = False):
    return compiler.compile(
        GrammarSpec("json_schema", json.dumps(schema), lenient=lenient), backend
    )


def _agrees_with_jsonschema(compiled, tokenizer, schema: dict, accepted, refused) -> None:
    """Each text is accepted by the grammar iff jsonschema (the schema's own draft) says
    it is valid, and the texts fall on the sides the test says."""
    cls = jsonschema.validators.validator_for(schema)
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    for text in accepted:
        assert validator.is_valid(json.loads(text)), text
        assert accepts_text(compiled, tokenizer, text), text
    for text in refused:
        assert not validator.is_valid(json.loads(text)), text
        assert not accepts_text(compiled, tokenizer, text), text


@pytest.mark.parametrize(
    ("schema", "accepted", "refused"),
    [
        # draft-04 has no const: an annotation there, so any integer
        ({"$schema": DRAFT_04, "type": "integer", "const": 5}, ["5", "6"], ['"5"']),
        # draft-07 has no dependentRequired (2019-09's) ...
        ({"$schema": DRAFT_07, **AB, "dependentRequired": {"a": ["b"]}}, ['{"a":1}'], ['{"c":1}']),
        # ... but dependencies, in both its forms
        ({"$schema": DRAFT_07, **AB, "dependencies": {"a": ["b"]}}, ['{"a":1,"b":2}', '{"b":2}'],
         ['{"a":1}']),
        ({"$schema": DRAFT_07, **AB, "dependencies": {"b": {"required": ["a"]}}},
         ['{"a":1,"b":2}', '{"a":1}'], ['{"b":2}']),
        # 2020-12 has no dependencies: an annotation there
        ({**AB, "dependencies": {"a": ["b"]}}, ['{"a":1}'], ['{"a":"x"}']),
    ],
)  # fmt: skip
def test_each_draft_has_its_own_keywords(compiler, hf_tokenizer, schema, accepted, refused):
    compiled = _compile(compiler, schema)
    _agrees_with_jsonschema(compiled, hf_tokenizer, schema, accepted, refused)


@pytest.mark.parametrize(
    ("schema", "accepted", "refused"),
    [
        ({"not": {"type": "string"}}, ["1", "null", "[]"], ['"a"']),
        ({"not": {"type": ["number", "null"]}}, ['"a"', "true"], ["1", "1.5", "null"]),
        ({"type": "object", "propertyNames": {"enum": ["x", "y"]}}, ['{"x":1,"y":"s"}'],
         ['{"z":1}']),
        ({"type": "object", "propertyNames": {"maxLength": 2}, "properties": {"abc": {}}},
         ['{"ab":1}'], ['{"abc":1}']),
        # propertyNames through a $ref, as not / anyOf / oneOf of enums, beside the one
        # pattern property that takes every name, or saying only that names are strings
        ({"$defs": {"key": {"type": "string", "pattern": "^[a-z]+$"}}, "type": "object",
          "propertyNames": {"$ref": "#/$defs/key"}}, ['{"ab":1}'], ['{"Ab":1}']),
        ({"type": "object", "propertyNames": {"not": {"enum": ["x", "yz"]}}},
         ['{"y":1,"xy":2,"":3}'], ['{"x":1}', '{"yz":1}']),
        ({"type": "object", "propertyNames": {"anyOf": [{"enum": ["x"]}, {"pattern": "^a"}]}},
         ['{"x":1,"ab":2}'], ['{"b":1}']),
        ({"type": "object", "propertyNames": {"oneOf": [{"enum": ["x", "y"]}, {"const": "y"}]}},
         ['{"x":1}'], ['{"y":1}']),
        ({"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}, "additionalProperties": False,
          "patternProperties": {".*": {"type": "integer"}}, "properties": {"Q": {}, "n": {}}},
         ['{"n":2,"ab":1}'], ['{"Ab":1}', '{"ab":"s"}', '{"Q":1}', '{"n":"s"}']),
        ({"type": "object", "propertyNames": {"type": "string"},
          "additionalProperties": {"type": "string"}}, ['{"a":"b"}'], ['{"a":1}']),
        # a oneOf told apart by a const discriminator
        ({"oneOf": [{**OBJ, "properties": {"k": {"const": "a"}, "n": {"type": "integer"}},
                     "required": ["k", "n"]},
                    {**OBJ, "properties": {"k": {"const": "b"}, "s": {"type": "string"}},
                     "required": ["k"]}]},
         ['{"k":"a","n":1}', '{"k":"b"}', '{"k":"b","s":"x"}'], ['{"k":"a"}', '{"k":"c"}']),
        # pattern and length bounds together (xgrammar and outlines keep only one)
        ({"type": "string", "pattern": "^[a-z]+$", "minLength": 2, "maxLength": 3},
         ['"ab"', '"abc"'], ['"a"', '"abcd"', '"AB"']),
        ({"type": "string", "format": "email", "maxLength": 8}, ['"a@b.co"'], ['"abcde@fg.com"']),
        # allOf merged across $ref
        ({"$defs": {"named": {"type": "object", "properties": {"name": {"type": "string"}},
                              "required": ["name"]}},
          "allOf": [{"$ref": "#/$defs/named"},
                    {"properties": {"age": {"type": "integer"}}, "required": ["age"]}]},
         ['{"name":"a","age":1}'], ['{"name":"a"}', '{"age":1}']),
    ],
)  # fmt: skip
def test_llguidance_enforces_rewritten_and_merged_keywords_exactly(
    compiler, hf_tokenizer, schema, accepted, refused
):
    compiled = _compile(compiler, schema)
    _agrees_with_jsonschema(compiled, hf_tokenizer, schema, accepted, refused)


def test_a_oneof_it_cannot_prove_exclusive_is_refused_unless_lenient(compiler, hf_tokenizer):
    schema = {"oneOf": [{"type": "integer"}, {"type": "number"}]}
    with pytest.raises(UnsupportedGrammarError, match="oneOf"):
        _compile(compiler, schema)
    compiled = _compile(compiler, schema, lenient=True)
    assert any("oneOf read as anyOf" in w for w in compiled.warnings)
    assert accepts_text(compiled, hf_tokenizer, "1.5")


@pytest.mark.parametrize("backend", sorted(ENFORCED_KEYWORDS))
def test_lenient_drops_what_it_cannot_enforce_and_says_so(compiler, hf_tokenizer, backend):
    # contains: no backend enforces it
    tag = {
        "type": "object",
        "properties": {"p": {"type": "string", "format": "idn-hostname"}},
        "required": ["p"],
        "additionalProperties": False,
    }
    schema = {"type": "object", "properties": {"tags": {"type": "array", "items": tag,
              "contains": {"required": ["p"]}}}, "required": ["tags"],
              "additionalProperties": False}  # fmt: skip
    with pytest.raises(UnsupportedGrammarError, match="contains at #/properties/tags"):
        _compile(compiler, schema, backend)
    del schema["properties"]["tags"]["contains"]
    where = "#/properties/tags/items/properties/p"
    with pytest.raises(UnsupportedGrammarError, match=f"'idn-hostname' at {where}"):
        _compile(compiler, schema, backend)
    schema["properties"]["tags"]["contains"] = {"required": ["p"]}
    compiled = _compile(compiler, schema, backend, lenient=True)
    containment, fmt = compiled.warnings  # outer first
    assert "contains at #/properties/tags" in containment
    assert f"'idn-hostname' at {where}" in fmt
    # what stays is still enforced
    assert accepts_text(compiled, hf_tokenizer, '{"tags":[{"p":"a"},{"p":"a"}]}')
    assert not accepts_text(compiled, hf_tokenizer, '{"tags":[1]}')


@pytest.mark.parametrize("backend", sorted(ENFORCED_KEYWORDS))
def test_formats_the_specification_does_not_define_are_annotations(compiler, hf_tokenizer, backend):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "format": "int32"},
              "s": {"type": "string", "format": "textarea"}}, "required": ["n", "s"],
              "additionalProperties": False}  # fmt: skip
    compiled = _compile(compiler, schema, backend)
    assert compiled.warnings == ()
    assert accepts_text(compiled, hf_tokenizer, '{"n":12,"s":"x"}')
    assert not accepts_text(compiled, hf_tokenizer, '{"n":"12","s":"x"}')


def test_no_ops_need_no_backend(compiler, hf_tokenizer):
    schema = {"type": "array", "items": {"type": "integer"}, "uniqueItems": False,
              "then": {"type": "string"}}  # fmt: skip
    compiled = _compile(compiler, schema, "outlines")
    assert accepts_text(compiled, hf_tokenizer, "[1,1]")


def test_the_schema_cannot_loosen_llguidance_through_its_own_options(compiler, hf_tokenizer):
    schema = {"type": "array", "items": {"type": "object"}, "contains": {"required": ["a"]},
              "x-guidance": {"lenient": True, "whitespace_flexible": True}}  # fmt: skip
    with pytest.raises(UnsupportedGrammarError, match="contains"):
        _compile(compiler, schema)
    schema = {"type": "array", "items": {"type": "integer"},
              "x-guidance": {"whitespace_flexible": True, "item_separator": ", "}}  # fmt: skip
    compiled = _compile(compiler, schema)
    assert accepts_text(compiled, hf_tokenizer, "[1,2]")
    assert not accepts_text(compiled, hf_tokenizer, "[1, 2]")


# Schemas on which a backend, measured, drops a keyword without a word (xgrammar 0.2.9:
# pattern without type string, required beside anyOf, multipleOf on a number or beside a
# range of over 10,000 integers, bounds on a node of no type), as JSONSchemaBench's
# real schemas use them: every backend enforces each exactly or refuses it by name.
QUIET_DROPS = {
    "pattern_without_type": ({"pattern": "^.*\\.xsl$"}, ['"a.xsl"', "12"], ['"Philips.js"']),
    "length_without_type": ({"maxLength": 2}, ['"ab"', "123"], ['"abc"']),
    "required_beside_anyof": (
        {"type": "object", "properties": {"type": {"type": "string"}, "value": {"type": "integer"}},
         "required": ["type", "value"],
         "anyOf": [{"properties": {"type": {"const": "DESY"}}},
                   {"properties": {"type": {"const": "X"}}}]},
        ['{"type":"DESY","value":1}'], ['{"type":"DESY"}', '{"type":"Y","value":1}']),
    "number_multiple_of": ({"type": "number", "multipleOf": 0.5}, ["1.5", "2"], ["1.25"]),
    "multiple_of_beside_a_wide_range": (
        {"type": "integer", "minimum": 0, "maximum": 10000, "multipleOf": 7}, ["14"], ["15"]),
    "multiple_of_beside_an_open_range": (
        {"type": "integer", "minimum": 0, "multipleOf": 7}, ["14"], ["15", "-7"]),
    "multiple_of_beside_a_narrow_range": (
        {"type": "integer", "minimum": 0, "maximum": 9999, "multipleOf": 7}, ["14"], ["15"]),
    "bounds_without_type": ({"minimum": 0, "maximum": 10}, ["5", '"s"'], ["11", "-1"]),
}  # fmt: skip


@pytest.mark.parametrize("backend", sorted(ENFORCED_KEYWORDS))
@pytest.mark.parametrize("name", sorted(QUIET_DROPS))
def test_no_keyword_is_dropped_quietly(compiler, hf_tokenizer, backend, name):
    schema, accepted, refused = QUIET_DROPS[name]
    try:
        compiled = _compile(compiler, schema, backend)
    except UnsupportedGrammarError as e:
        assert " at #" in str(e)  # refused by name and place
        return
    _agrees_with_jsonschema(compiled, hf_tokenizer, schema, accepted, refused)


@pytest.mark.parametrize("backend", ["xgrammar", "auto"])
@pytest.mark.parametrize(
    ("pattern", "accepted", "refused"),
    [
        ("^(?!@@)[@a-z]+$", "@a", "@@a"),  # xgrammar would ignore the lookahead
        ("^(a|b$)c$", "ac", "bc"),  # and the anchor inside (taking "bc")
    ],
)
def test_a_regex_assertion_a_backend_would_ignore_is_refused_by_name(
    compiler, hf_tokenizer, backend, pattern, accepted, refused
):
    for schema, good, bad in [
        ({"type": "string", "pattern": pattern}, json.dumps(accepted), json.dumps(refused)),
        ({"type": "object", "patternProperties": {pattern: {"type": "integer"}},
          "additionalProperties": False}, f'{{"{accepted}":1}}', f'{{"{refused}":1}}'),
    ]:  # fmt: skip
        try:
            compiled = _compile(compiler, schema, backend)
        except UnsupportedGrammarError as e:
            if backend == "xgrammar":
                assert "pattern" in str(e) and " at #" in str(e), str(e)
            continue
        _agrees_with_jsonschema(compiled, hf_tokenizer, schema, [good], [bad])


@pytest.mark.parametrize(
    ("schema", "accepted", "refused"),
    [
        # exclusive by type once each branch is read beside its parent's type
        ({"type": "object", "oneOf": [
            {"properties": {"shape": {"enum": ["circle"]}, "r": {"type": "number"}},
             "required": ["shape", "r"]},
            {"properties": {"shape": {"enum": ["square"]}, "side": {"type": "number"}},
             "required": ["shape", "side"]}]},
         ['{"shape":"circle","r":1}', '{"shape":"square","side":2}'], ['{"shape":"circle"}']),
        # exclusive once the $ref is followed
        ({"$defs": {"when": {"type": "string", "format": "date"}},
          "oneOf": [{"$ref": "#/$defs/when"}, {"type": "null"}]},
         ['"2024-01-02"', "null"], ["1", '"x"']),
        # not {}: a property that may not appear
        ({**OBJ, "properties": {"a": {"type": "integer"}, "b": {"not": {}}}}, ['{"a":1}'],
         ['{"a":1,"b":2}']),
    ],
)  # fmt: skip
def test_oneof_proven_exclusive_and_not_anything(compiler, hf_tokenizer, schema, accepted, refused):
    compiled = _compile(compiler, schema)
    _agrees_with_jsonschema(compiled, hf_tokenizer, schema, accepted, refused)


def test_llguidance_counts_properties_only_when_all_are_required(compiler):
    # an object that may hold other properties: no list of which are there says it
    schema = {"type": "object", "properties": {"a": {}, "b": {}}, "required": ["a"],
              "minProperties": 2, "additionalProperties": {"type": "integer"}}  # fmt: skip
    with pytest.raises(UnsupportedGrammarError, match="minProperties at # .* optional"):
        _compile(compiler, schema)


def test_a_schema_llguidance_proves_unsatisfiable_accepts_nothing(compiler):
    # every object it allows has a, b and r, so it matches both branches: never one
    schema = {"type": "object", "properties": {"a": {}, "b": {}, "r": {}},
              "required": ["a", "b", "r"],
              "oneOf": [{"required": ["a"]}, {"required": ["r"]}]}  # fmt: skip
    with pytest.raises(GrammarError, match="accepts nothing") as info:
        _compile(compiler, schema)
    assert not isinstance(info.value, UnsupportedGrammarError)


def test_oneof_told_apart_by_its_branches_own_values(compiler, hf_tokenizer):
    schema = {"type": "string", "oneOf": [{"enum": ["web"]}, {"const": "privileged"}]}
    compiled = _compile(compiler, schema)
    _agrees_with_jsonschema(compiled, hf_tokenizer, schema, ['"web"', '"privileged"'], ['"x"'])


def test_min_and_max_properties_the_rest_already_satisfies(compiler, hf_tokenizer):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
              "additionalProperties": False, "minProperties": 1, "maxProperties": 2}  # fmt: skip
    compiled = _compile(compiler, schema)
    accepted, refused = ['{"a":1}', '{"b":1}', '{"a":1,"b":2}'], ["{}"]
    _agrees_with_jsonschema(compiled, hf_tokenizer, schema, accepted, refused)


def test_an_object_that_lists_its_properties_is_generated_closed(compiler, hf_tokenizer):
    # What xgrammar's strict mode does too: valid either way, and the model cannot wander
    # into keys of its own. Not where a sibling subschema merges with the object.
    listed = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert not accepts_text(_compile(compiler, listed), hf_tokenizer, '{"a":1,"b":2}')
    for open_object in (
        {**listed, "additionalProperties": True},
        {"type": "object"},
        {"allOf": [listed, {"properties": {"b": {"type": "integer"}}}]},
        {**listed, "required": ["b"]},  # b is not listed
    ):
        assert accepts_text(_compile(compiler, open_object), hf_tokenizer, '{"a":1,"b":2}')
