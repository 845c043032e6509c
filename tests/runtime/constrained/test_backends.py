"""Both backends against the real tokenizer: masks, EOS, special tokens, rollback,
terminal states and forced strings, on the same specs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixlm.runtime.constrained import GrammarSpec
from radixlm.runtime.errors import GrammarError, UnsupportedGrammarError
from tests.runtime.constrained.conftest import accepts_text, allowed_ids

BACKENDS = ["outlines", "xgrammar", "llguidance"]
PERSON = json.dumps(
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "city": {"type": "string"}},
        "required": ["name", "city"],
        "additionalProperties": False,
    }
)
EOS = 2
IM_START = 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_regex_accepts_matches_and_rejects_the_rest(compiler, hf_tokenizer, backend):
    phone = compiler.compile(GrammarSpec("regex", r"\(\d{3}\) \d{3}-\d{4}"), backend)
    assert accepts_text(phone, hf_tokenizer, "(555) 123-4567")
    assert not accepts_text(phone, hf_tokenizer, "(555) 123-456a")
    assert not accepts_text(phone, hf_tokenizer, "555-123-4567")


@pytest.mark.parametrize("backend", BACKENDS)
def test_mask_is_exactly_the_tokens_that_continue_a_match(compiler, vocab, backend):
    matcher = compiler.compile(GrammarSpec("regex", r"(yes|no)!"), backend).new_matcher()
    allowed = allowed_ids(matcher, vocab)
    spelled = {vocab.token_bytes[t] for t in allowed}
    # every allowed token is a prefix of a match, and every one-token prefix is allowed
    assert all(b"yes!".startswith(b) or b"no!".startswith(b) for b in spelled)
    expected = {
        t
        for t, b in enumerate(vocab.token_bytes)
        if b and (b"yes!".startswith(b) or b"no!".startswith(b))
    }
    assert allowed == expected


@pytest.mark.parametrize("backend", BACKENDS)
def test_eos_only_where_the_output_may_end(compiler, vocab, hf_tokenizer, backend):
    matcher = compiler.compile(GrammarSpec("regex", r"\d+"), backend).new_matcher()
    assert EOS not in allowed_ids(matcher, vocab)
    assert matcher.accept_token(hf_tokenizer.convert_tokens_to_ids("7"))
    assert EOS in allowed_ids(matcher, vocab)
    assert not matcher.is_terminal()  # more digits may follow
    assert matcher.accept_token(EOS)
    assert matcher.is_terminal()


@pytest.mark.parametrize("backend", BACKENDS)
def test_special_tokens_never_allowed_inside_a_json_string(compiler, vocab, hf_tokenizer, backend):
    matcher = compiler.compile(GrammarSpec("json_schema", PERSON), backend).new_matcher()
    for token in hf_tokenizer.encode('{"name":"Al', add_special_tokens=False):
        assert matcher.accept_token(token)
    allowed = allowed_ids(matcher, vocab)
    assert len(allowed) > 10_000  # almost any text may go in a string ...
    assert not allowed & set(range(17))  # ... but no special token, EOS included
    assert not matcher.accept_token(IM_START)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rollback_restores_mask_and_forced_string(compiler, vocab, hf_tokenizer, backend):
    matcher = compiler.compile(GrammarSpec("json_schema", PERSON), backend).new_matcher()
    tokens = hf_tokenizer.encode('{"name":"Ann","', add_special_tokens=False)
    for token in tokens[:-2]:
        matcher.accept_token(token)
    before = (allowed_ids(matcher, vocab), matcher.forced_string())
    for token in tokens[-2:]:
        assert matcher.accept_token(token)
    assert matcher.forced_string() == 'city":"'
    matcher.rollback(2)
    assert (allowed_ids(matcher, vocab), matcher.forced_string()) == before


@pytest.mark.parametrize("backend", BACKENDS)
def test_forced_strings(compiler, hf_tokenizer, backend):
    person = compiler.compile(GrammarSpec("json_schema", PERSON), backend).new_matcher()
    assert person.forced_string() == '{"name":"'
    phone = compiler.compile(GrammarSpec("regex", r"\d{3}-\d{4}"), backend).new_matcher()
    assert phone.forced_string() == ""
    for token in hf_tokenizer.encode("555", add_special_tokens=False):
        assert phone.accept_token(token)
    assert phone.forced_string() == "-"


@pytest.mark.parametrize("backend", BACKENDS)
def test_complete_output_with_nothing_to_follow_is_terminal(compiler, hf_tokenizer, backend):
    matcher = compiler.compile(GrammarSpec("json_schema", PERSON), backend).new_matcher()
    for token in hf_tokenizer.encode('{"name":"A","city":"B"}', add_special_tokens=False):
        assert not matcher.is_terminal()
        assert matcher.accept_token(token)
    assert matcher.is_terminal()


@pytest.mark.parametrize("backend", BACKENDS)
def test_choices_are_literal(compiler, hf_tokenizer, backend):
    spec = GrammarSpec("choices", json.dumps(["a+b", "yes", "yesterday", "(x)"]))
    compiled = compiler.compile(spec, backend)
    for choice in ("a+b", "yes", "yesterday", "(x)"):
        assert accepts_text(compiled, hf_tokenizer, choice)
    for other in ("aab", "ye", "x", "yes!"):
        assert not accepts_text(compiled, hf_tokenizer, other)


def test_xgrammar_compiles_ebnf_and_outlines_refuses_it(compiler, hf_tokenizer):
    grammar = 'root ::= expr\nexpr ::= num ("+" num)*\nnum ::= [0-9]+'
    compiled = compiler.compile(GrammarSpec("ebnf", grammar), "xgrammar")
    assert accepts_text(compiled, hf_tokenizer, "12+3+45")
    assert not accepts_text(compiled, hf_tokenizer, "12++3")
    with pytest.raises(UnsupportedGrammarError, match="grammar_backend='xgrammar'"):
        compiler.compile(GrammarSpec("ebnf", grammar), "outlines")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("kind", "spec", "message"),
    [
        ("regex", "(ab", "regular expression|parenthesis"),
        ("regex", r"[^\s\S]", "accepts nothing"),
        ("json_schema", json.dumps({"type": "strnig"}), "not a valid JSON Schema"),
        ("json_schema", json.dumps({"type": "string", "minLength": 5, "maxLength": 2}), "nothing"),
        ("json_schema", json.dumps({"enum": []}), "not a valid JSON Schema|accepts nothing"),
        ("json_schema", json.dumps({"type": "array", "contains": {"type": "integer"}}), "contains"),
    ],
)
def test_bad_specs_are_rejected_with_a_clear_error(compiler, backend, kind, spec, message):
    with pytest.raises(GrammarError, match=message) as info:
        compiler.compile(GrammarSpec(kind, spec), backend)
    assert info.value.field == kind


def test_outlines_fsm_size_is_bounded(vocab):
    from radixlm.runtime.config import GrammarConfig
    from radixlm.runtime.constrained import GrammarCompiler

    small = GrammarCompiler(vocab, GrammarConfig(grammar_max_states=20))
    try:
        with pytest.raises(GrammarError, match="grammar_max_states 20.*xgrammar"):
            small.compile(GrammarSpec("regex", r"[a-z]{30}"), "outlines")
        spec = GrammarSpec("regex", r"[a-z]{30}")
        assert small.compile(spec, "xgrammar").backend == "xgrammar"
    finally:
        small.close()  # its compile worker is this test's own


@pytest.mark.parametrize("backend", BACKENDS)
def test_bounded_json_whitespace(compiler, hf_tokenizer, backend):
    schema = '{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],' + (
        '"additionalProperties":false}'
    )
    compact = compiler.compile(GrammarSpec("json_schema", schema), backend)
    loose = compiler.compile(GrammarSpec("json_schema", schema, max_whitespace=2), backend)
    assert accepts_text(compact, hf_tokenizer, '{"a":1}')
    assert not accepts_text(compact, hf_tokenizer, '{"a": 1}')
    assert accepts_text(loose, hf_tokenizer, '{"a":  1}')
    assert not accepts_text(loose, hf_tokenizer, '{"a":   1}')


def _call_tag(name: str, schema: dict) -> dict:
    return {
        "type": "tag",
        "begin": f'<tool_call>{{"name": "{name}", "arguments": ',
        "content": {"type": "json_schema", "json_schema": schema},
        "end": "}</tool_call>",
    }


def test_xgrammar_compiles_structural_tags_and_outlines_refuses_them(compiler, hf_tokenizer):
    city = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    tags = {"type": "triggered_tags", "triggers": ["<tool_call>"], "tags": [_call_tag("w", city)]}
    spec = GrammarSpec("structural_tag", json.dumps({"type": "structural_tag", "format": tags}))
    compiled = compiler.compile(spec, "xgrammar")
    assert accepts_text(compiled, hf_tokenizer, "Just text.")
    assert accepts_text(
        compiled,
        hf_tokenizer,
        '<tool_call>{"name": "w", "arguments": {"city": "Oslo"}}</tool_call>',
    )  # noqa: E501
    assert not accepts_text(
        compiled, hf_tokenizer, '<tool_call>{"name": "w", "arguments": {"city": 1}}</tool_call>'
    )  # noqa: E501
    assert not accepts_text(compiled, hf_tokenizer, '<tool_call>{"name": "x"')
    with pytest.raises(UnsupportedGrammarError, match="grammar_backend='xgrammar'"):
        compiler.compile(spec, "outlines")


def test_structural_tag_schemas_get_the_keyword_check(compiler):
    unique = {"type": "array", "uniqueItems": True}
    tags = {"type": "tags_with_separator", "separator": "", "tags": [_call_tag("u", unique)]}
    spec = GrammarSpec("structural_tag", json.dumps({"type": "structural_tag", "format": tags}))
    with pytest.raises(GrammarError, match="embedded JSON schema.*uniqueItems") as info:
        compiler.compile(spec, "xgrammar")
    assert info.value.field == "structural_tag"


SCHEMAS = Path(__file__).resolve().parents[2] / "data" / "schemas"


def test_llguidance_takes_the_first_token_of_a_grammar_with_a_wide_parser_row(
    compiler, hf_tokenizer
):
    # minecraft-recipe.json's first row holds 12,594 Earley items: past llguidance's
    # default row limit its matcher refused the "{" its own mask allowed
    text = (SCHEMAS / "minecraft-recipe.json").read_text()
    compiled = compiler.compile(GrammarSpec("json_schema", text), "llguidance")
    recipe = {"type": "minecraft:smelting", "ingredient": {"item": "a"}, "result": "b"}
    assert accepts_text(compiled, hf_tokenizer, json.dumps(recipe, separators=(",", ":")))
