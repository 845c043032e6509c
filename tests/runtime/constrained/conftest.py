"""Fixtures over the default model's tokenizer: its vocabulary and a grammar compiler."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest


@pytest.fixture(scope="session")
def vocab(hf_tokenizer):
    from radixlm.runtime.constrained import TokenVocabulary

    return TokenVocabulary.from_tokenizer(hf_tokenizer, len(hf_tokenizer), frozenset({2}))


@pytest.fixture(scope="package")
def compiler(vocab):
    """One compiler (and its compile worker) for the package's modules, closed after."""
    from radixlm.runtime.config import GrammarConfig
    from radixlm.runtime.constrained import GrammarCompiler
    from tests.conftest import share_compiler, unshare_compiler

    compiler = GrammarCompiler(vocab, GrammarConfig())
    yield share_compiler(compiler)
    unshare_compiler(compiler)
    compiler.close()


def allowed_ids(matcher, vocab) -> set[int]:
    """The token ids a matcher allows next, read back from its bitmask row."""
    import torch

    from radixlm.kernels.bitmask import allowed_token_ids

    bitmask = torch.zeros(1, vocab.bitmask_width, dtype=torch.int32)
    matcher.fill_bitmask(bitmask, 0)
    return set(allowed_token_ids(bitmask[0], vocab.vocab_size).tolist())


def endless_decode(compiled, vocab, wanted: re.Pattern[bytes], max_tokens: int = 400) -> str:
    """What a decoder that wants to go on writes under ``compiled``: each step the longest
    allowed token that ``wanted`` matches whole (``rb"[0-9]+"``: a number that never
    ends), else the longest allowed one; until the grammar ends or ``max_tokens``."""
    matcher, pieces = compiled.new_matcher(), []
    for _ in range(max_tokens):
        allowed = allowed_ids(matcher, vocab) - vocab.eos_token_ids
        if matcher.is_terminal() or not allowed:
            break
        piece = vocab.token_bytes
        token = max(allowed, key=lambda t: (bool(wanted.fullmatch(piece[t])), len(piece[t])))
        assert matcher.accept_token(token)
        pieces.append(piece[token])
    return b"".join(pieces).decode()


def accepts_text(compiled, tokenizer, text: str) -> bool:
    """Whether a fresh matcher accepts ``text`` (tokenised as the tokenizer would) and
    is then complete."""
    matcher = compiled.new_matcher()
    for token in tokenizer.encode(text, add_special_tokens=False):
        if not matcher.accept_token(token):
            return False
    return matcher.accept_token(2) or matcher.is_terminal()


def assert_enforced(compiled, tokenizer, schema: dict, good: list[str], bad: list[str]) -> None:
    """Each text of ``good`` passes the compiled grammar and jsonschema (2020-12, formats
    checked); each of ``bad`` passes neither: the grammar enforces what the schema says."""
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    validator = jsonschema.Draft202012Validator(schema, format_checker=checker)
    for text in good:
        assert accepts_text(compiled, tokenizer, text), text
        assert validator.is_valid(json.loads(text)), text
    for text in bad:
        assert not accepts_text(compiled, tokenizer, text), text
        assert not validator.is_valid(json.loads(text)), text
