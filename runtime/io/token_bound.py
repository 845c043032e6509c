"""A lower bound on a text's token count, known before tokenizing it.

A prompt of 8 MB takes seconds and gigabytes to tokenize; one that cannot fit in the
model's context need not be tokenized at all. Each token of a BPE tokenizer covers at
most ``max_chars_per_token`` characters of the (normalized) text, so

    num_tokens >= len(normalized text) / max_chars_per_token
               >= len(text) / (max_chars_per_token * shrink)

where ``shrink`` bounds how many characters the normalizer may fold into one (NFC and
NFKC compose at most four code points, e.g. Greek omega with three marks, into one).
A vocabulary entry is never shorter than the text it stands for: a byte-level entry
spells one byte per character, ``▁`` one space, ``<0x41>`` one byte, an added token its
own text; so the longest entry bounds ``max_chars_per_token``.

The bound holds only where no step drops text unboundedly: a normalizer that strips or
replaces with less, a pre-tokenizer that removes whitespace, unknown characters fused
into one token, or an added token that swallows the whitespace around it. Any of those
(or a tokenizer that is not a fast one) leaves no bound: ``at_least`` is then 0.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["TokenBound"]

# How many characters a normalizer may turn into one (None: unbounded: it may delete).
_NORMALIZER_SHRINK: dict[str, int | None] = {
    "NFC": 4,
    "NFKC": 4,
    "NFD": 1,
    "NFKD": 1,
    "Lowercase": 1,  # Unicode lowercasing never maps one character to none
    "Prepend": 1,
    "Nmt": None,  # drops control characters
    "Strip": None,
    "StripAccents": None,
    "BertNormalizer": None,
    "Precompiled": None,
}
# Pre-tokenizers that split (or map one character to one) but never drop text.
_KEEPING_PRE_TOKENIZERS = frozenset(
    {"ByteLevel", "Metaspace", "Split", "Digits", "Punctuation", "UnicodeScripts"}
)


@dataclass(frozen=True)
class TokenBound:
    """``chars_per_token``: the most characters of the raw text one token may stand for
    (None: no bound is known)."""

    chars_per_token: int | None = None

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> TokenBound:
        """The bound of a transformers fast tokenizer (none for anything else)."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        get_vocab = getattr(tokenizer, "get_vocab", None)
        if backend is None or get_vocab is None:
            return cls()
        try:
            spec = json.loads(backend.to_str())
            vocab = get_vocab()
        except Exception:  # a backend without a JSON form: no bound, never a wrong one
            return cls()
        shrink = _pipeline_shrink(spec)
        if shrink is None or not vocab:
            return cls()
        return cls(max(len(token) for token in vocab) * shrink)

    def at_least(self, text: str) -> int:
        """A lower bound on the tokens of ``text`` (special tokens added only add)."""
        if self.chars_per_token is None:
            return 0
        return -(-len(text) // self.chars_per_token)


def _pipeline_shrink(spec: dict[str, Any]) -> int | None:
    """How many raw characters may become one normalized character, if the pipeline
    keeps every character (None: it may drop some, or is not one this knows)."""
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or model.get("fuse_unk"):
        return None
    for added in spec.get("added_tokens") or []:
        if added.get("lstrip") or added.get("rstrip"):
            return None
    if not _keeps_text(spec.get("pre_tokenizer")):
        return None
    return _normalizer_shrink(spec.get("normalizer"))


def _normalizer_shrink(normalizer: dict[str, Any] | None) -> int | None:
    if normalizer is None:
        return 1
    kind = normalizer.get("type")
    if kind == "Sequence":
        total = 1
        for step in normalizer.get("normalizers") or []:
            shrink = _normalizer_shrink(step)
            if shrink is None:
                return None
            total *= shrink
        return total
    if kind == "Replace":
        pattern, content = normalizer.get("pattern") or {}, normalizer.get("content") or ""
        if "String" not in pattern or not content:  # a regex may match any length
            return None
        return max(1, -(-len(pattern["String"]) // len(content)))
    return _NORMALIZER_SHRINK.get(kind)


def _keeps_text(pre_tokenizer: dict[str, Any] | None) -> bool:
    if pre_tokenizer is None:
        return True
    kind = pre_tokenizer.get("type")
    if kind == "Sequence":
        return all(_keeps_text(p) for p in pre_tokenizer.get("pretokenizers") or [])
    if pre_tokenizer.get("behavior") == "Removed":
        return False
    return kind in _KEEPING_PRE_TOKENIZERS
