"""Jump-forward keeps the token sequence one the tokenizer itself would produce.

A fake model that always picks the next token of the tokenizer's own encoding of a
valid output is run with jump-forward between its steps: after every jump the output
must still be a prefix of that encoding, and the grammar state must match it.
"""

from __future__ import annotations

import pytest

from radixlm.runtime.constrained import GrammarSpec, JumpForward
from radixlm.runtime.io.sampling_params import SamplingParams
from tests.runtime.constrained.cases import CASES
from tests.runtime.constrained.conftest import allowed_ids

NEWLINE = 198  # the chat template's last prompt token
SIMULATED = [
    pytest.param(case, text, id=f"{case.name}/{i}")
    for case in CASES
    if case.kind in ("json_schema", "regex")
    for i, text in enumerate(case.valid[:2])
]


@pytest.fixture(scope="module")
def jump(hf_tokenizer, vocab):
    return JumpForward(hf_tokenizer, vocab)


def simulate(compiled, jump, tokenizer, text: str) -> tuple[list[int], int]:
    """Decodes ``text`` token by token with jump-forward; returns the ids and the number
    of model steps it took."""
    canonical = tokenizer.encode(text, add_special_tokens=False)
    matcher, out, steps = compiled.new_matcher(), [], 0
    while len(out) < len(canonical):
        token = canonical[len(out)]
        assert matcher.accept_token(token)
        out.append(token)
        steps += 1
        planned = jump.advance(matcher, out[-1], replaceable=True, max_tokens=1000)
        if planned is not None:
            if planned.replaces_last:
                out.pop()
            out.extend(planned.tokens)
            assert out == canonical[: len(out)], "jump-forward left the tokenizer's encoding"
            assert tokenizer.decode(planned.text_tokens) == tokenizer.decode(
                planned.tokens
            ).removeprefix(tokenizer.decode([token]) if planned.replaces_last else "")
    assert matcher.accept_token(2) or matcher.is_terminal()
    return out, steps


@pytest.mark.parametrize(("case", "text"), SIMULATED)
def test_jumps_follow_the_tokenizers_own_encoding(compiler, jump, hf_tokenizer, case, text):
    spec = SamplingParams(**case.params()).grammar
    compiled = compiler.compile(spec, "xgrammar")
    out, _ = simulate(compiled, jump, hf_tokenizer, text)
    assert out == hf_tokenizer.encode(text, add_special_tokens=False)


def test_jumps_save_steps_on_an_object(compiler, jump, hf_tokenizer):
    schema = (
        '{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},'
        '"ok":{"type":"boolean"}},"required":["name","age","ok"],"additionalProperties":false}'
    )
    compiled = compiler.compile(GrammarSpec("json_schema", schema), "xgrammar")
    text = '{"name":"Ann","age":31,"ok":true}'
    out, steps = simulate(compiled, jump, hf_tokenizer, text)
    assert steps <= len(out) - 5  # `name` and the `","age":` / `,"ok":` keys are jumped


def test_forced_text_merging_into_the_last_token_replaces_it(compiler, jump, hf_tokenizer, vocab):
    schema = (
        '{"type":"object","properties":{"a":{"type":"string"},'
        '"age":{"type":"integer","minimum":0}},"required":["a","age"],'
        '"additionalProperties":false}'
    )  # minimum 0: only digits follow `":`, which never merge with it (a `-` could)
    matcher = compiler.compile(GrammarSpec("json_schema", schema), "xgrammar").new_matcher()
    for token in hf_tokenizer.encode('{"a":"x"', add_special_tokens=False):
        assert matcher.accept_token(token)
    quote = hf_tokenizer.encode('"', add_special_tokens=False)[0]
    assert matcher.forced_string() == ',"age":'
    assert jump.advance(matcher, quote, replaceable=False, max_tokens=100) is None
    before = allowed_ids(matcher, vocab)
    assert jump.advance(matcher, quote, replaceable=True, max_tokens=1) is None  # no room
    assert allowed_ids(matcher, vocab) == before  # a refused jump leaves the matcher as it was
    planned = jump.advance(matcher, quote, replaceable=True, max_tokens=100)
    assert planned is not None and planned.replaces_last
    assert hf_tokenizer.decode(planned.tokens) == '","age":'  # `","` replaces `"`
    assert hf_tokenizer.decode(planned.text_tokens) == ',"age":'
    assert matcher.forced_string() == ""  # the matcher is past the key


def test_forced_tokens_spell_the_forced_text_and_leave_the_matcher(compiler, jump, hf_tokenizer):
    """What speculative decoding proposes: the forced text's tokens after the last one
    (which stays), the matcher unmoved; the text's own tokens where it would merge
    into the last token."""
    schema = (
        '{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},'
        '"required":["name","age"],"additionalProperties":false}'
    )
    matcher = compiler.compile(GrammarSpec("json_schema", schema), "xgrammar").new_matcher()
    (opening,) = hf_tokenizer.encode('{"', add_special_tokens=False)  # one token
    assert matcher.accept_token(opening)
    tokens = jump.forced_tokens(matcher, opening)
    assert hf_tokenizer.decode(tokens) == 'name":"'
    assert matcher.forced_string() == 'name":"'  # unmoved
    for token in hf_tokenizer.encode('name":"Ann"', add_special_tokens=False):
        assert matcher.accept_token(token)
    quote = hf_tokenizer.encode('"', add_special_tokens=False)[0]
    assert matcher.forced_string() == ',"age":'  # `","` would merge into `"`:
    assert hf_tokenizer.decode(jump.forced_tokens(matcher, quote)) == ',"age":'  # alone
