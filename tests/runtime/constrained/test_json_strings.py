"""json_max_string_length: every string a schema leaves unbounded gets a maxLength, on
every backend, and a decoder that never wants a string to end is stopped by it."""

from __future__ import annotations

import json
import re

import pytest

from radixlm.runtime.config import GrammarConfig
from radixlm.runtime.constrained import GrammarCompiler, GrammarSpec
from radixlm.runtime.constrained.json_numbers import bound_schema
from radixlm.runtime.constrained.json_strings import bound_string_regex, string_bound
from radixlm.runtime.constrained.registry import REGISTRY
from radixlm.runtime.errors import ConfigError, UnsupportedGrammarError
from tests.runtime.constrained.conftest import accepts_text, endless_decode

BACKENDS = ["outlines", "xgrammar", "llguidance"]
SCHEMA_BACKENDS = ["xgrammar", "llguidance"]  # free-form values (outlines: too slow)
N = 4
_NO_QUOTE = re.compile(rb'[^"]+')  # a decoder that never wants a string to end
STRINGS = {
    "type": "object",
    "properties": {
        "open": {"type": "string"},
        "own": {"type": "string", "maxLength": 8},
        "longer": {"type": "string", "minLength": 6},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
    },
    "required": ["open", "own", "longer", "tags"],
}


def _compile(compiler, schema: dict, backend: str, length: int | None = N, **kwargs):
    spec = GrammarSpec("json_schema", json.dumps(schema), max_string_length=length, **kwargs)
    return compiler.compile(spec, backend)


def _text(**changes) -> str:
    value = {"open": "x" * N, "own": "y" * 8, "longer": "z" * 6, "tags": ["t" * N], **changes}
    return json.dumps(value, separators=(",", ":"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_open_strings_are_bounded_and_a_schemas_own_bounds_kept(compiler, hf_tokenizer, backend):
    compiled = _compile(compiler, STRINGS, backend)
    assert accepts_text(compiled, hf_tokenizer, _text())
    assert not accepts_text(compiled, hf_tokenizer, _text(open="x" * (N + 1)))
    assert not accepts_text(compiled, hf_tokenizer, _text(tags=["t" * (N + 1)]))
    assert not accepts_text(compiled, hf_tokenizer, _text(own="y" * 9))  # its own bound
    # a minLength past the bound wins: the schema still accepts what it says
    assert accepts_text(compiled, hf_tokenizer, _text(longer="z" * 6))
    assert not accepts_text(compiled, hf_tokenizer, _text(longer="z" * 7))


@pytest.mark.parametrize("backend", BACKENDS)
def test_off_by_default_and_zero_is_off(compiler, hf_tokenizer, backend):
    long = _text(open="x" * 40, tags=["t" * 40])
    assert accepts_text(_compile(compiler, STRINGS, backend, None), hf_tokenizer, long)
    assert accepts_text(_compile(compiler, STRINGS, backend, 0), hf_tokenizer, long)


@pytest.mark.parametrize("backend", SCHEMA_BACKENDS)
@pytest.mark.parametrize("numbers", [True, False])
def test_strings_in_free_form_values_are_bounded_keys_are_not(
    compiler, hf_tokenizer, backend, numbers
):
    schema = {"type": "object", "properties": {"v": {}}, "required": ["v"]}
    compiled = _compile(compiler, schema, backend, bounded_numbers=numbers)
    assert accepts_text(compiled, hf_tokenizer, '{"v":{"a long key":["abcd",{"k":"wxyz"}]}}')
    assert not accepts_text(compiled, hf_tokenizer, '{"v":"abcde"}')
    assert not accepts_text(compiled, hf_tokenizer, '{"v":[{"k":"abcde"}]}')


def test_llguidance_bounds_a_pattern_but_never_below_its_shortest_match(compiler, hf_tokenizer):
    schema = {
        "type": "object",
        "properties": {"p": {"type": "string", "pattern": "^[a-z]{6}[a-z]*$"}},
        "required": ["p"],
    }
    compiled = _compile(compiler, schema, "llguidance")
    assert accepts_text(compiled, hf_tokenizer, '{"p":"abcdef"}')
    assert not accepts_text(compiled, hf_tokenizer, '{"p":"abcdefg"}')


def test_where_no_bound_is_added():
    llguidance, xgrammar = REGISTRY.json_schema("llguidance"), REGISTRY.json_schema("xgrammar")
    string = {"type": "string"}
    assert string_bound(string, 5, xgrammar) == string_bound(string, 5, llguidance) == 5
    for node in (
        {"type": "string", "maxLength": 90},  # the schema's own
        {"type": "string", "format": "date-time"},  # a format decides (both backends)
        {"type": "string", "pattern": "^[a-z]{3}$"},  # its matches fit already
        {"type": "string", "pattern": r"^\p{L}+$"},  # unreadable here: left to the pattern
    ):
        assert string_bound(node, 5, llguidance) is None, node
    for node in ({"type": "string", "pattern": "a+"}, {"type": ["string", "null"]}):
        assert string_bound(node, 5, xgrammar) is None, node  # one string keyword family
        assert string_bound(node, 5, llguidance) == 5, node


def test_negated_subschemas_are_left_alone():
    schema = {"type": "string", "not": {"type": "string"}}
    bounded = bound_schema(schema, "llguidance", numbers=False, max_string_length=3)
    assert bounded == {"type": "string", "not": {"type": "string"}, "maxLength": 3}


def test_outlines_regex_bounds_each_open_string_and_refuses_its_own_fragment():
    chars = r'([^"\\\x00-\x1F\x7F-\x9F]|\\["\\/bfnrt])'
    regex = f'"{chars}*",{chars}{{9,}},{chars}{{0,2}}'
    assert bound_string_regex(regex, "{}", 5) == f'"{chars}{{0,5}}",{chars}{{9,9}},{chars}{{0,2}}'
    with pytest.raises(UnsupportedGrammarError, match="json_max_string_length"):
        bound_string_regex(regex, json.dumps({"pattern": chars + "*"}), 5)


def test_the_engine_option_is_the_default_a_request_overrides(vocab, hf_tokenizer):
    compiler = GrammarCompiler(vocab, GrammarConfig(json_max_string_length=N))
    try:
        schema = {"type": "string"}
        assert not accepts_text(_compile(compiler, schema, "llguidance", None), hf_tokenizer,
                                '"abcde"')  # fmt: skip
        assert accepts_text(_compile(compiler, schema, "llguidance", 0), hf_tokenizer, '"abcde"')
    finally:
        compiler.close()


@pytest.mark.parametrize("value", [0, -1, 16_385, True, 2.0])
def test_the_engine_option_is_checked(value):
    with pytest.raises(ConfigError, match="json_max_string_length"):
        GrammarConfig(json_max_string_length=value)


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    if isinstance(value, dict):
        return [s for item in value.values() for s in _strings(item)]
    return []


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_decoder_that_never_closes_a_string_is_stopped_by_the_bound(compiler, vocab, backend):
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "notes": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 2},
        },
        "required": ["name", "notes"],
    }
    text = endless_decode(_compile(compiler, schema, backend, 12), vocab, _NO_QUOTE)
    strings = _strings(json.loads(text))  # raises unless the JSON ended
    assert len(strings) == 3 and all(len(s) == 12 for s in strings), text
    unbounded = endless_decode(_compile(compiler, schema, backend, None), vocab, _NO_QUOTE, 60)
    assert len(unbounded) > 100 and unbounded.count('"') == 3  # still in the first string
