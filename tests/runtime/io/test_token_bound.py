"""The lower bound on a text's tokens: sound where the tokenizer keeps every character,
absent where it may drop some (tiny in-memory tokenizers, no model)."""

from __future__ import annotations

import pytest
from tokenizers import AddedToken, Tokenizer, normalizers, pre_tokenizers
from tokenizers.models import BPE
from transformers import PreTrainedTokenizerFast

from radixlm.runtime.io.token_bound import TokenBound


def byte_level(normalizer=None, pre_tokenizer=None, added=()) -> PreTrainedTokenizerFast:
    """A byte-level BPE over the 256 bytes plus the merges that make "aaaa"."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    vocab["aa"], vocab["aaaa"] = len(vocab), len(vocab) + 1
    tok = Tokenizer(BPE(vocab, [("a", "a"), ("aa", "aa")]))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer or pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.add_tokens(list(added))
    return PreTrainedTokenizerFast(tokenizer_object=tok)


@pytest.mark.parametrize("text", ["a" * 1001, "é" * 300 + "a" * 77, "<|sep|>" * 40, " " * 99])
def test_the_bound_never_exceeds_the_count(text):
    tokenizer = byte_level(added=[AddedToken("<|sep|>")])
    bound = TokenBound.from_tokenizer(tokenizer)
    assert bound.chars_per_token == len("<|sep|>")  # the longest entry, an added token
    count = len(tokenizer(text)["input_ids"])
    assert 0 < bound.at_least(text) <= count


def test_a_composing_normalizer_divides_the_bound():
    tokenizer = byte_level(normalizers.NFC())
    bound = TokenBound.from_tokenizer(tokenizer)
    assert bound.chars_per_token == len("aaaa") * 4
    greek = "\u03c9\u0313\u0300\u0345" * 50  # four code points, one after NFC
    assert bound.at_least(greek) <= len(tokenizer(greek)["input_ids"])


@pytest.mark.parametrize(
    "tokenizer",
    [
        byte_level(normalizers.Strip()),
        byte_level(normalizers.Replace("aaaa", "")),
        byte_level(pre_tokenizer=pre_tokenizers.Whitespace()),
        byte_level(added=[AddedToken("<m>", lstrip=True)]),
    ],
    ids=["strip", "replace-with-nothing", "whitespace-dropped", "lstrip-added-token"],
)
def test_a_tokenizer_that_may_drop_text_has_no_bound(tokenizer):
    assert TokenBound.from_tokenizer(tokenizer) == TokenBound(None)
    assert TokenBound.from_tokenizer(tokenizer).at_least("x" * 10_000) == 0


def test_an_object_without_a_backend_has_no_bound():
    assert TokenBound.from_tokenizer(object()).at_least("x" * 10_000) == 0
