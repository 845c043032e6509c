"""Jump-forward: turning text the grammar forces into tokens the tokenizer would produce.

Appending forced text token by token costs a decode step per token; appending
it all at once costs one extend pass. Peers removed this optimisation because
re-tokenising at the seams changed outputs. Both seams are handled here::

    ... prev | forced text ................ | model continues
             ^ start seam                   ^ end seam

- start: ``prev`` + forced is tokenised together; the jump happens only if that
  gives ``prev`` back unchanged as its first token (the forced text does not
  merge into it). Otherwise this step decodes normally.
- end: the forced text's last token could merge with what the model writes next
  (``:"`` + ``"`` -> ``:""``). BPE never merges across a pre-tokenizer boundary,
  so the last token is kept only if the pre-tokenizer puts a boundary at the seam
  for every character class the grammar allows next (``":"`` then a letter: yes;
  ``":`` then ``-``: no). Otherwise it is left for the model to decode, under the
  grammar's mask, where it may pick the merged token.

Every token appended is accepted by the request's matcher, so the FSM, the
output ids and (after the extend pass) the radix cache stay consistent.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache
from typing import Any

import torch

from radixlm.runtime.constrained.base import GrammarMatcher
from radixlm.runtime.constrained.vocab import TokenVocabulary

__all__ = ["JumpForward"]

# More distinct next-character classes than this: assume a merge is possible.
_MAX_CLASSES = 48


class JumpForward:
    """Plans jump-forward tokens for one tokenizer (cheap to call every step)."""

    def __init__(self, tokenizer: Any, vocab: TokenVocabulary) -> None:
        self._tokenizer = tokenizer
        self._vocab = vocab
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._pre_tokenizer = getattr(backend, "pre_tokenizer", None)
        self._class_of, self._class_text = _first_char_classes(vocab)
        self._probe = torch.empty(1, vocab.bitmask_width, dtype=torch.int32)
        self._is_boundary = lru_cache(maxsize=4096)(self._boundary_uncached)

    def advance(self, matcher: GrammarMatcher, prev_token: int) -> list[int]:
        """Accepts the tokens of the text ``matcher`` forces and returns them ([] if none
        or if a seam is unclean; the matcher is then unchanged)."""
        forced = matcher.forced_string()
        if not forced:
            return []
        tokens = self._tokens(prev_token, forced)
        for n, token in enumerate(tokens):
            if not matcher.accept_token(token):
                matcher.rollback(n)
                return []
        if tokens and not self._seam_is_boundary(matcher, forced):
            matcher.rollback(1)
            tokens.pop()
        return tokens

    def _tokens(self, prev_token: int, forced: str) -> list[int]:
        """Tokens of ``forced`` as tokenised after ``prev_token``; [] if it merges with it."""
        prev = self._vocab.token_bytes[prev_token] if prev_token < self._vocab.vocab_size else None
        try:
            prev_text = prev.decode() if prev is not None else ""
        except UnicodeDecodeError:  # prev ends inside a character: no clean seam
            return []
        ids = self._tokenizer.encode(prev_text + forced, add_special_tokens=False)
        if prev_text:
            if not ids or ids[0] != prev_token:
                return []
            ids = ids[1:]
        spelled = b"".join(self._vocab.token_bytes[i] or b"\0" for i in ids)
        return ids if spelled == forced.encode() else []

    def _seam_is_boundary(self, matcher: GrammarMatcher, forced: str) -> bool:
        """Whether nothing the grammar allows next can merge with the forced text's end."""
        if self._pre_tokenizer is None:
            return False
        matcher.fill_bitmask(self._probe, 0)
        words = self._probe[0].to(torch.int64) & 0xFFFFFFFF
        allowed = ((words[:, None] >> torch.arange(32)) & 1).flatten()[: self._vocab.vocab_size]
        classes = torch.unique(self._class_of[allowed.bool()]).tolist()
        if len(classes) > _MAX_CLASSES or -1 in classes:
            return False
        return all(self._is_boundary(forced, self._class_text[c]) for c in classes)

    def _boundary_uncached(self, forced: str, following: str) -> bool:
        pieces = self._pre_tokenizer.pre_tokenize_str(forced + following)
        return any(end == len(forced) for _, (_, end) in pieces)


def _first_char_classes(vocab: TokenVocabulary) -> tuple[torch.Tensor, list[str]]:
    """(V,) class id of each token's first character, and one example text per class.

    Pre-tokenizers split by Unicode category, so every letter behaves like "a" and
    every digit like "0"; whitespace and punctuation keep their own class. Class -1:
    a token starting inside a UTF-8 character (unknown: never trusted); EOS, special
    and unused ids get class 0 (an empty continuation, which merges with nothing).
    """
    texts: dict[str, int] = {"": 0}
    class_of = torch.zeros(vocab.vocab_size, dtype=torch.int64)
    for i, piece in enumerate(vocab.token_bytes):
        if not piece:
            continue
        try:
            first = chr(piece[0]) if piece[0] < 0x80 else _lead(piece)
        except UnicodeDecodeError:
            class_of[i] = -1
            continue
        category = unicodedata.category(first)
        key = "a" if category.startswith("L") else "0" if category == "Nd" else first
        class_of[i] = texts.setdefault(key, len(texts))
    return class_of, list(texts)


def _lead(piece: bytes) -> str:
    """The first character of a token starting with a multi-byte UTF-8 character."""
    for cut in range(2, min(len(piece), 4) + 1):
        try:
            return piece[:cut].decode()[0]
        except UnicodeDecodeError:
            continue
    raise UnicodeDecodeError("utf-8", piece, 0, len(piece), "token starts inside a character")
