from __future__ import annotations


def test_token_bytes_are_raw_bytes_not_decoded_text(vocab, hf_tokenizer):
    space_the = hf_tokenizer.convert_tokens_to_ids("Ġthe")
    assert vocab.token_bytes[space_the] == b" the"
    # Tokens holding part of a UTF-8 character keep their bytes (decode() gives U+FFFD).
    partial = [i for i, b in enumerate(vocab.token_bytes) if b is not None and _not_utf8(b)]
    assert len(partial) > 100
    for i in partial[:50]:
        assert "\ufffd" in hf_tokenizer.decode([i])


def test_every_token_round_trips_through_its_bytes(vocab, hf_tokenizer):
    text = 'naïve café 東京 🙂 {"a": [1, 2]}\n\tend'
    ids = hf_tokenizer.encode(text, add_special_tokens=False)
    assert b"".join(vocab.token_bytes[i] for i in ids).decode() == text


def test_special_and_eos_tokens_are_excluded(vocab, hf_tokenizer):
    assert vocab.eos_token_ids == frozenset({2})
    for token in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<file_sep>"):
        assert vocab.token_bytes[hf_tokenizer.convert_tokens_to_ids(token)] is None
    assert sum(b is None for b in vocab.token_bytes) == 17  # ids 0-16 of SmolLM2


def _not_utf8(data: bytes) -> bool:
    try:
        data.decode()
        return False
    except UnicodeDecodeError:
        return True


def _with_markers(hf_tokenizer):
    """The default model's tokenizer with two tool markers added as special tokens."""
    import copy

    from radixlm.runtime.constrained import TokenVocabulary

    tok = copy.deepcopy(hf_tokenizer)
    tok.add_special_tokens({"additional_special_tokens": ["[TOOL_CALLS]", "<|python_tag|>"]})
    return tok, TokenVocabulary.from_tokenizer(tok, len(tok), frozenset({2}))


def test_a_variant_spells_the_special_tokens_it_names_and_no_other(hf_tokenizer):
    tok, vocab = _with_markers(hf_tokenizer)
    calls = tok.convert_tokens_to_ids("[TOOL_CALLS]")
    tag = tok.convert_tokens_to_ids("<|python_tag|>")
    assert vocab.special["[TOOL_CALLS]"] == calls and "<|im_end|>" not in vocab.special  # EOS
    assert vocab.token_bytes[calls] is None and vocab.token_bytes[tag] is None
    variant = vocab.with_special_tokens(["[TOOL_CALLS]", "[ARGS]"])  # [ARGS]: not a token
    assert variant.token_bytes[calls] == b"[TOOL_CALLS]" and variant.token_bytes[tag] is None
    assert variant.key != vocab.key and "[TOOL_CALLS]" in variant.key
    im_start = tok.convert_tokens_to_ids("<|im_start|>")
    assert variant.token_bytes[im_start] is None and variant.eos_token_ids == vocab.eos_token_ids
    changed = [i for i, b in enumerate(variant.token_bytes) if b != vocab.token_bytes[i]]
    assert changed == [calls]
    assert vocab.with_special_tokens(["[ARGS]", "<|im_end|>"]) is vocab  # none it may spell
    assert vocab.special_among(["<|python_tag|>", "x", "[TOOL_CALLS]"]) == (
        "<|python_tag|>",
        "[TOOL_CALLS]",
    )


def test_only_a_grammar_over_the_variant_writes_the_marker_token(hf_tokenizer):
    from radixlm.runtime.config import GrammarConfig
    from radixlm.runtime.constrained.llguidance_backend import LLGuidanceBackend
    from radixlm.runtime.constrained.spec import GrammarSpec
    from radixlm.runtime.constrained.xgrammar_backend import XGrammarBackend
    from tests.runtime.constrained.conftest import allowed_ids

    tok, vocab = _with_markers(hf_tokenizer)
    calls = tok.convert_tokens_to_ids("[TOOL_CALLS]")
    spec = GrammarSpec("regex", r"(\[TOOL_CALLS\]|ok) \[")
    for backend in (XGrammarBackend, LLGuidanceBackend):
        plain = backend(vocab, GrammarConfig()).compile(spec).new_matcher()
        assert calls not in allowed_ids(plain, vocab) and not plain.accept_token(calls)
        variant = vocab.with_special_tokens(["[TOOL_CALLS]"])
        matcher = backend(variant, GrammarConfig()).compile(spec).new_matcher()
        assert calls in allowed_ids(matcher, variant) and matcher.accept_token(calls)
        assert matcher.forced_string() == " ["


def test_the_compiler_keys_a_grammar_by_the_special_tokens_the_tokenizer_has(hf_tokenizer):
    from radixlm.runtime.config import GrammarConfig
    from radixlm.runtime.constrained import GrammarCompiler
    from radixlm.runtime.constrained.spec import GrammarSpec
    from tests.runtime.constrained.conftest import allowed_ids

    tok, vocab = _with_markers(hf_tokenizer)
    calls = tok.convert_tokens_to_ids("[TOOL_CALLS]")
    compiler = GrammarCompiler(vocab, GrammarConfig())
    try:
        text = r"(\[TOOL_CALLS\]|ok)!"
        plain = compiler.start(GrammarSpec("regex", text), "xgrammar")
        marked = compiler.start(
            GrammarSpec("regex", text, special_tokens=("[TOOL_CALLS]",)), "xgrammar"
        )
        unknown = compiler.start(GrammarSpec("regex", text, special_tokens=("[ARGS]",)), "xgrammar")
        assert marked.spec.special_tokens == ("[TOOL_CALLS]",)
        assert unknown is plain  # no such special token: the plain vocabulary's compile
        assert calls in allowed_ids(compiler.compile(marked.spec, "xgrammar").new_matcher(), vocab)
        assert calls not in allowed_ids(
            compiler.compile(plain.spec, "xgrammar").new_matcher(), vocab
        )
    finally:
        compiler.close()
