"""Bounded JSON numbers through every backend: integers within +-(2^53 - 1), numbers in
that range with at most 6 fraction digits, wherever a schema leaves them open; a
schema's own bounds kept; the engine option and the per-request switch."""

from __future__ import annotations

import json
import re

import pytest

from radixlm.runtime.config import GrammarConfig
from radixlm.runtime.constrained import GrammarCompiler, GrammarSpec
from radixlm.runtime.constrained.json_numbers import (
    _BOUNDED_INTEGER,
    _BOUNDED_NUMBER,
    MAX_SAFE_INTEGER,
    bound_schema,
)
from radixlm.runtime.errors import UnsupportedGrammarError
from tests.runtime.constrained.conftest import accepts_text, endless_decode

BACKENDS = ["outlines", "xgrammar", "llguidance"]
SCHEMA_BACKENDS = ["xgrammar", "llguidance"]  # min / max enforced: a schema's own bounds
M = MAX_SAFE_INTEGER
TWENTY = "1" * 20


def _compile(compiler, schema: dict, backend: str, bounded: bool | None = None, **kwargs):
    spec = GrammarSpec("json_schema", json.dumps(schema), bounded_numbers=bounded, **kwargs)
    return compiler.compile(spec, backend)


def _in_object(schema: dict) -> dict:
    """Numbers inside an object: outlines-core refuses a top-level "1" then "." (a token
    through an accepting state into a non-accepting one; docs/constrained.md, known
    limits of outlines-core)."""
    return {"type": "object", "properties": {"v": schema}, "required": ["v"]}


def _agrees(compiled, tokenizer, accepted, refused) -> None:
    for text in accepted:
        assert accepts_text(compiled, tokenizer, text), text
    for text in refused:
        assert not accepts_text(compiled, tokenizer, text), text


@pytest.mark.parametrize("backend", BACKENDS)
def test_integers_stay_within_the_safe_range(compiler, hf_tokenizer, backend):
    compiled = _compile(compiler, {"type": "integer"}, backend)
    accepted = [str(M), str(-M), "0", "-12", "9007199254740990", "999999999999999"]
    refused = [str(M + 1), str(-M - 1), TWENTY, "9007199254741000", "10000000000000000"]
    _agrees(compiled, hf_tokenizer, accepted, refused)


@pytest.mark.parametrize("backend", BACKENDS)
def test_numbers_have_the_range_and_six_fraction_digits(compiler, hf_tokenizer, backend):
    compiled = _compile(compiler, _in_object({"type": "number"}), backend)
    accepted = ["1.5", "-0.000001", "3.141593", "12", str(M), f"{M - 1}.999999", f"{M}.0"]
    refused = ["1.1234567", "1e5", "1.5E-3", f"{M}.5", str(M + 1), TWENTY, "0.0000001"]
    wrap = '{{"v":{}}}'.format
    _agrees(compiled, hf_tokenizer, map(wrap, accepted), map(wrap, refused))


@pytest.mark.parametrize("backend", SCHEMA_BACKENDS)
@pytest.mark.parametrize(
    ("schema", "accepted", "refused"),
    [
        # both sides its own: beyond the default range (both backends read bounds up to
        # 1e18: past it llguidance refuses the range and xgrammar misreads it, measured)
        ({"type": "integer", "minimum": 0, "maximum": 10**18}, ["9" * 18, str(10**18)],
         ["-1", str(10**18 + 1)]),
        # the upper side open beyond: the default would contradict its minimum
        ({"type": "integer", "minimum": 10**17}, [str(10**18), TWENTY], [str(10**16)]),
        # the lower side its own, the upper one the default
        ({"type": "integer", "exclusiveMinimum": -(10**15)}, [str(1 - 10**15), str(M)],
         [str(M + 1), str(-(10**15))]),
        ({"type": "number", "minimum": -1e17, "maximum": 1e17}, ["-99999999999999999.5"],
         ["100000000000000000.5", "1.1234567"]),
    ],
)  # fmt: skip
def test_a_schema_keeps_its_own_bounds(compiler, hf_tokenizer, backend, schema, accepted, refused):
    _agrees(_compile(compiler, schema, backend), hf_tokenizer, accepted, refused)


def test_outlines_reads_no_bounds_of_a_schema(compiler, hf_tokenizer):
    # outlines-core ignores minimum / maximum: refused by name, or (lenient) dropped with a
    # warning and the default range applied
    schema = {"type": "integer", "minimum": 0, "maximum": 10**20}
    with pytest.raises(UnsupportedGrammarError, match="minimum"):
        _compile(compiler, schema, "outlines")
    compiled = _compile(compiler, schema, "outlines", lenient=True)
    assert compiled.warnings
    _agrees(compiled, hf_tokenizer, [str(M)], [str(M + 1)])


NESTED = {
    "type": "object",
    "properties": {
        "items": {"type": "array", "items": {"type": "integer"}},
        "maybe": {"anyOf": [{"type": "number"}, {"type": "null"}]},
        "ref": {"$ref": "#/$defs/count"},
        "pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}]},
        "map": {"type": "object", "additionalProperties": {"type": "integer"}},
    },
    "required": ["items", "maybe", "ref", "pair", "map"],
    "additionalProperties": False,
    "$defs": {"count": {"type": "integer"}},
}
NESTED_GOOD = {"items": [1, M], "maybe": 2.5, "ref": -M, "pair": [3, "x"], "map": {"k": 4}}
NESTED_BAD = [
    {"items": [1, M + 1]},
    {"maybe": 2.1234567},
    {"ref": -M - 1},
    {"pair": [int(TWENTY), "x"]},
    {"map": {"k": int(TWENTY)}},
]
# An untyped value too (outlines: a free-form value's FSM runs past the compile limit,
# bounded or not).
OPEN = {"any": {"description": "x"}, "open": {"type": "object", "additionalProperties": True}}
WITH_ANY = {**NESTED, "properties": {**NESTED["properties"], **OPEN}}
ANY_GOOD = {"any": [1.5, {"n": M}], "open": {"k": [2]}}
ANY_BAD = [
    {"any": int(TWENTY)},
    {"any": [[int(TWENTY)]]},
    {"any": {"deep": {"er": [M + 1]}}},
    {"open": {"k": [int(TWENTY)]}},
]


def _texts(good: dict, changes: list[dict]) -> list[str]:
    return [json.dumps({**good, **c}, separators=(",", ":")) for c in changes]


@pytest.mark.parametrize("backend", BACKENDS)
def test_numbers_nested_anywhere_are_bounded(compiler, hf_tokenizer, backend):
    compiled = _compile(compiler, NESTED, backend)
    _agrees(compiled, hf_tokenizer, _texts(NESTED_GOOD, [{}]), _texts(NESTED_GOOD, NESTED_BAD))
    if backend in SCHEMA_BACKENDS:
        good = {**NESTED_GOOD, **ANY_GOOD}
        compiled = _compile(compiler, WITH_ANY, backend)
        _agrees(compiled, hf_tokenizer, _texts(good, [{}]), _texts(good, NESTED_BAD + ANY_BAD))


@pytest.mark.parametrize("backend", SCHEMA_BACKENDS)
def test_free_form_values_of_json_object_are_bounded(compiler, hf_tokenizer, backend):
    # json_object: {"type": "object"}, every value free (outlines: its FSM takes minutes)
    compiled = _compile(compiler, {"type": "object"}, backend)
    accepted = ['{"a":1,"b":[2.5,{"c":null}],"d":"x"}', f'{{"a":[{{"b":{M}}}]}}']
    refused = [f'{{"a":{TWENTY}}}', f'{{"a":[{{"b":{M + 1}}}]}}', '{"a":{"b":[1.1234567]}}']
    _agrees(compiled, hf_tokenizer, accepted, refused)


@pytest.mark.parametrize("backend", SCHEMA_BACKENDS)
def test_a_free_form_root_and_open_items(compiler, hf_tokenizer, backend):
    any_value = _compile(compiler, {"title": "anything"}, backend)
    _agrees(any_value, hf_tokenizer, ['"s"', "[1,{}]", str(M)], [TWENTY, f"[{TWENTY}]"])
    array = _compile(compiler, {"type": "array"}, backend)
    _agrees(array, hf_tokenizer, ["[1,[2]]"], [f"[1,[{TWENTY}]]"])


def test_subschemas_with_ids_of_their_own_reach_the_bounded_value(compiler, hf_tokenizer):
    # draft-04 ids below the root: "#/$defs/..." inside one would resolve against it
    schema = {"$schema": "http://json-schema.org/draft-04/schema#", "id": "http://e.x/root",
              "type": "object", "properties": {"v": {"id": "http://e.x/root/v",
                                                     "type": "object"}}}  # fmt: skip
    compiled = _compile(compiler, schema, "llguidance")
    _agrees(compiled, hf_tokenizer, ['{"v":{"a":[1]}}', f'{{"v":{{"a":{M}}}}}'],
            [f'{{"v":{{"a":{TWENTY}}}}}', f'{{"v":{{"a":[{TWENTY}]}}}}'])  # fmt: skip


def test_an_untyped_node_has_its_numbers_bounded_on_llguidance(compiler, hf_tokenizer):
    # numbers are among an untyped node's values (xgrammar reads its type from keywords)
    compiled = _compile(compiler, _in_object({"description": "x", "maxLength": 3}), "llguidance")
    wrap = '{{"v":{}}}'.format
    _agrees(compiled, hf_tokenizer, map(wrap, ['"abc"', "12", "[1]"]),
            map(wrap, ['"abcd"', TWENTY, f"[{TWENTY}]"]))  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_request_switch_off_restores_any_length(compiler, hf_tokenizer, backend):
    ints = _compile(compiler, {"type": "integer"}, backend, bounded=False)
    _agrees(ints, hf_tokenizer, [TWENTY, str(M + 1)], [])
    nested = _compile(compiler, NESTED, backend, bounded=False)
    _agrees(nested, hf_tokenizer, _texts(NESTED_GOOD, NESTED_BAD), [])
    if backend in SCHEMA_BACKENDS:
        nested = _compile(compiler, WITH_ANY, backend, bounded=False)
        _agrees(nested, hf_tokenizer, _texts({**NESTED_GOOD, **ANY_GOOD}, ANY_BAD), [])


def test_the_engine_option_is_the_default_a_request_overrides(vocab, hf_tokenizer):
    compiler = GrammarCompiler(vocab, GrammarConfig(json_bounded_numbers=False))
    try:
        schema = {"type": "integer"}
        _agrees(_compile(compiler, schema, "llguidance"), hf_tokenizer, [TWENTY], [])
        _agrees(_compile(compiler, schema, "llguidance", True), hf_tokenizer, [], [TWENTY])
    finally:
        compiler.close()


def test_the_cache_key_holds_the_resolved_choice(compiler):
    schema = {"type": "integer", "title": "cache key"}
    left_open = _compile(compiler, schema, "llguidance")  # GrammarConfig's default: on
    assert _compile(compiler, schema, "llguidance", True) is left_open
    assert _compile(compiler, schema, "llguidance", False) is not left_open
    # not a JSON kind: the choice is no part of it
    regex = GrammarSpec("regex", "[0-9]+")
    assert compiler.compile(regex, "outlines") is compiler.compile(regex, "outlines")


def _tool_call_tag(schema: dict) -> str:
    tag = {
        "type": "tag",
        "begin": '<tool_call>{"name": "f", "arguments": ',
        "content": {"type": "json_schema", "json_schema": schema},
        "end": "}</tool_call>",
    }
    fmt = {"type": "tags_with_separator", "tags": [tag], "separator": "", "at_least_one": True}
    return json.dumps({"type": "structural_tag", "format": fmt})


@pytest.mark.parametrize("bounded", [None, False])
def test_tool_call_arguments_in_a_structural_tag(compiler, hf_tokenizer, bounded):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "extra": {}},
              "required": ["n", "extra"]}  # fmt: skip
    spec = GrammarSpec("structural_tag", _tool_call_tag(schema), bounded_numbers=bounded)
    compiled = compiler.compile(spec, "xgrammar")
    call = '<tool_call>{{"name": "f", "arguments": {}}}</tool_call>'.format
    good = [call(f'{{"n": {M}, "extra": [1.5]}}')]
    long = [call(f'{{"n": {M + 1}, "extra": 1}}'), call(f'{{"n": 1, "extra": {{"k": {TWENTY}}}}}')]
    _agrees(compiled, hf_tokenizer, good + (long if bounded is False else []), [])
    if bounded is None:
        _agrees(compiled, hf_tokenizer, [], long)


def test_xgrammar_keeps_an_integers_own_multiple_of_over_the_range(compiler, hf_tokenizer):
    # xgrammar drops multipleOf beside a range of over 10,000 integers: it wins
    compiled = _compile(compiler, {"type": "integer", "multipleOf": 7}, "xgrammar")
    _agrees(compiled, hf_tokenizer, ["14", "7" * 21], ["15"])


def test_outlines_refuses_a_pattern_holding_its_number_regex(compiler):
    schema = _in_object({"type": "string", "pattern": "^(-)?(0|[1-9][0-9]*)$"})
    with pytest.raises(UnsupportedGrammarError, match="json_bounded_numbers=False"):
        _compile(compiler, schema, "outlines")
    _compile(compiler, schema, "outlines", bounded=False)  # off: nothing to tell apart


def test_outlines_bounded_regexes_are_exact():
    integer, number = re.compile(_BOUNDED_INTEGER + r"\Z"), re.compile(_BOUNDED_NUMBER + r"\Z")
    edges = [0, 1, 9, 10, 10**15 - 1, 10**15, 8999999999999999, M - 10, M - 1, M, M + 1,
             9007199254741000, 9007200000000000, 10**16, 10**17]  # fmt: skip
    for value in edges + [-v for v in edges]:
        assert bool(integer.match(str(value))) == (abs(value) <= M), value
        assert bool(number.match(f"{value}.25")) == (abs(value) < M), value
    assert number.match(f"{M}.000000") and not number.match(f"{M}.000001")
    assert not number.match("1.1234567") and not number.match("1e5")


def test_the_bounded_value_is_kept_off_merged_subschemas():
    # llguidance cannot intersect two recursive schemas: none is put below allOf, nor in
    # a $defs entry a merged $ref reaches
    schema = {
        "allOf": [{"$ref": "#/$defs/a"}, {"properties": {"x": {}}}],
        "$defs": {"a": {"type": "object", "properties": {"n": {"type": "integer"}}},
                  "radixlm_bounded_json_value": {"type": "string"}},
    }  # fmt: skip
    out = bound_schema(json.loads(json.dumps(schema)), "llguidance")
    assert "$ref" not in json.dumps(out["allOf"][1]) and "additionalProperties" not in out
    assert out["$defs"]["a"]["properties"]["n"]["maximum"] == M  # numbers bounded still
    assert "additionalProperties" not in out["$defs"]["a"]
    assert out["$defs"]["radixlm_bounded_json_value"] == {"type": "string"}  # not replaced
    assert bound_schema({"type": "object"}, "outlines") == {"type": "object"}


def test_a_property_a_pattern_also_matches_is_merged(compiler, hf_tokenizer):
    # "default" takes both its own schema and the pattern's: llguidance intersects them,
    # so neither reaches the (recursive) bounded value; "x" alone does
    edition = {"required": ["name"], "properties": {"name": {"type": "string"}}}
    schema = {
        "type": "object",
        "$defs": {"edition": edition},
        "properties": {
            "eds": {
                "type": "object",
                "patternProperties": {"^[a-z]*$": {"$ref": "#/$defs/edition"}},
                "properties": {"default": {"$ref": "#/$defs/edition"}},
            },
            "free": {"type": "object"},
        },
    }
    out = bound_schema(json.loads(json.dumps(schema)), "llguidance")
    assert not {"additionalProperties", "items"} & out["$defs"]["edition"].keys()
    free = out["properties"]["free"]["additionalProperties"]
    assert free == {"$ref": "#/$defs/radixlm_bounded_json_value"}
    compiled = _compile(compiler, schema, "llguidance")
    good = ['{"eds":{"default":{"name":"a","n":[1]}}}', f'{{"free":{{"x":[{M}]}}}}']
    bad = ['{"eds":{"default":{}}}', f'{{"free":{{"x":[{TWENTY}]}}}}']
    _agrees(compiled, hf_tokenizer, good, bad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_decoder_that_never_ends_a_number_is_stopped_by_the_bounds(compiler, vocab, backend):
    # Numbers can never cause an output cut at the token limit: each ends by 24 characters.
    schema = {
        "type": "object",
        "properties": {"i": {"type": "integer"}, "n": {"type": "number"}},
        "required": ["i", "n"],
    }
    digits = re.compile(rb"[0-9.]+")
    text = endless_decode(_compile(compiler, schema, backend), vocab, digits)
    numbers = re.findall(r"-?[0-9][0-9.]*", text)
    assert json.loads(text).keys() == {"i", "n"}  # raises unless the JSON ended
    assert len(numbers) == 2 and all(len(n) <= 24 for n in numbers), text
    endless = endless_decode(_compile(compiler, schema, backend, False), vocab, digits, 60)
    last = re.findall(r"-?[0-9][0-9.]*", endless)[-1]
    assert endless.endswith(last) and len(last) > 24, endless  # unbounded: still going
