"""Jump-forward: turning text the grammar forces into tokens the tokenizer would produce.

Appending forced text token by token costs a decode step per token; appending
it all at once costs one extend pass. Peers removed this optimisation because
re-tokenising at the seams changed outputs. Both seams are handled here::

    ... prev | forced text ................ | model continues
             ^ start seam                   ^ end seam

- start: ``prev`` + forced is tokenised together. If that gives ``prev`` back as
  its first token, the forced tokens follow it. If the forced text merges into it
  (``"`` + ``,"age":`` -> ``","`` ``age`` ``":``) and ``prev`` was just sampled (not
  yet run through the model, so no KV holds it), ``prev`` is replaced by the
  re-tokenised sequence; otherwise this step decodes normally.
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
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from radixlm.kernels.bitmask import allowed_token_ids
from radixlm.runtime.constrained.base import GrammarMatcher
from radixlm.runtime.constrained.vocab import TokenVocabulary

__all__ = ["Jump", "JumpForward"]

# More distinct next-character classes, or allowed tokens, than this: assume a merge
# is possible (free text follows; the model decodes the seam itself).
_MAX_CLASSES = 48
_MAX_ALLOWED = 2048
_POPCOUNT = torch.tensor([bin(b).count("1") for b in range(256)])


@dataclass(frozen=True)
class Jump:
    """What to append to a request's output.

    Attributes:
        tokens: the new output tokens; they replace the output's last token when
            ``replaces_last`` (the forced text re-tokenised together with it).
        replaces_last: whether ``tokens`` start with a replacement of the last token.
        text_tokens: tokens that spell exactly the new text (what the detokenizer is
            fed: with ``replaces_last`` the last token's text was already streamed).
    """

    tokens: list[int]
    replaces_last: bool
    text_tokens: list[int]


class JumpForward:
    """Plans jump-forward tokens for one tokenizer (cheap to call every step)."""

    def __init__(self, tokenizer: Any, vocab: TokenVocabulary) -> None:
        self._tokenizer = tokenizer
        self._vocab = vocab
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._pre_tokenizer = getattr(backend, "pre_tokenizer", None)
        self._class_of, self._class_text = _first_char_classes(vocab)
        # Forced text may hold a special token's content (a tool call's "[TOOL_CALLS]"),
        # which the tokenizer encodes as that token: spelled so, the plan keeps it, and
        # the request's matcher accepts it only where its grammar may write it.
        self._special_bytes = {i: text.encode() for text, i in vocab.special.items()}
        self._probe = torch.empty(1, vocab.bitmask_width, dtype=torch.int32)
        # Requests with one schema meet the same seams again and again.
        self._is_boundary = lru_cache(maxsize=4096)(self._boundary_uncached)
        self._tokens = lru_cache(maxsize=4096)(self._tokens_uncached)
        self._alone = lru_cache(maxsize=4096)(self._alone_uncached)

    def advance(
        self, matcher: GrammarMatcher, last_token: int, replaceable: bool, max_tokens: int
    ) -> Jump | None:
        """Moves ``matcher`` over the text it forces and says which tokens spell it.

        Args:
            matcher: the request's matcher, positioned after ``last_token``.
            last_token: the sequence's last token.
            replaceable: whether ``last_token`` may be re-tokenised together with the
                forced text (true for a sampled token not yet run through the model).
            max_tokens: the most tokens the output may grow by.

        Returns:
            The jump, or None (matcher unchanged): nothing forced, an unclean seam,
            or no room.
        """
        forced = matcher.forced_string()
        if not forced:
            return None
        plan = self._tokens(last_token, forced, replaceable)
        if plan is None:
            return None
        tokens, replaces = list(plan[0]), plan[1]
        if replaces:
            matcher.rollback(1)
        if not self._accept(matcher, tokens):
            return self._undo(matcher, [], replaces, last_token)
        if not self._seam_is_boundary(matcher, forced):
            matcher.rollback(1)
            tokens.pop()
        text_tokens = self._text_tokens(tokens, last_token if replaces else None)
        grows_by = len(tokens) - replaces
        if not tokens or text_tokens is None or grows_by <= 0 or grows_by > max_tokens:
            return self._undo(matcher, tokens, replaces, last_token)
        return Jump(tokens, replaces, text_tokens)

    def forced_tokens(self, matcher: GrammarMatcher, last_token: int) -> tuple[int, ...]:
        """The tokens spelling the text ``matcher`` forces after ``last_token``, as the
        tokenizer writes it following that token (which stays), or, where the text
        would merge into that token (``"`` + ``,"age":``), as it writes the text alone
        (``,"`` ``age`` ``":``: the model, past the ``"``, most likely goes on so); ()
        when nothing is forced. The matcher does not move: speculative decoding
        proposes these tokens and verifies them.
        """
        forced = matcher.forced_string()
        if not forced:
            return ()
        plan = self._tokens(last_token, forced, False)
        return self._alone(forced) if plan is None else plan[0]

    def _alone_uncached(self, text: str) -> tuple[int, ...]:
        ids = self._tokenizer.encode(text, add_special_tokens=False)
        return tuple(ids) if self._spell(ids) == text.encode() else ()

    def _tokens_uncached(
        self, last_token: int, forced: str, replaceable: bool
    ) -> tuple[tuple[int, ...], bool] | None:
        """``forced`` tokenised after ``last_token``: (tokens, replaces_last), or None.

        If the forced text merges into ``last_token``, the tokens start with its
        replacement (only where ``replaceable``)."""
        last = self._vocab.token_bytes[last_token] if last_token < self._vocab.vocab_size else None
        try:
            last_text = last.decode() if last is not None else ""
        except UnicodeDecodeError:  # it ends inside a character: no clean seam
            return None
        ids = self._tokenizer.encode(last_text + forced, add_special_tokens=False)
        replaces = bool(last_text) and (not ids or ids[0] != last_token)
        if replaces and not replaceable:
            return None
        if last_text and not replaces:
            ids = ids[1:]
        expected = (last_text.encode() if replaces else b"") + forced.encode()
        return (tuple(ids), replaces) if self._spell(ids) == expected else None

    def _text_tokens(self, tokens: list[int], replaced: int | None) -> list[int] | None:
        """Tokens spelling the new text alone: ``tokens`` minus the replaced token's text."""
        if replaced is None:
            return tokens
        old = self._vocab.token_bytes[replaced] or b""
        new = self._spell(tokens)
        if not new.startswith(old) or len(new) == len(old):
            return None
        ids = self._tokenizer.encode(new[len(old) :].decode(), add_special_tokens=False)
        return ids if self._spell(ids) == new[len(old) :] else None

    def _spell(self, ids: list[int]) -> bytes:
        pieces = self._vocab.token_bytes
        return b"".join(pieces[i] or self._special_bytes.get(i, b"\0") for i in ids)

    @staticmethod
    def _accept(matcher: GrammarMatcher, tokens: list[int]) -> bool:
        for n, token in enumerate(tokens):
            if not matcher.accept_token(token):
                matcher.rollback(n)
                return False
        return True

    @staticmethod
    def _undo(matcher: GrammarMatcher, accepted: list[int], replaced: bool, last: int) -> None:
        matcher.rollback(len(accepted))
        if replaced:
            matcher.accept_token(last)
        return None

    def _seam_is_boundary(self, matcher: GrammarMatcher, forced: str) -> bool:
        """Whether nothing the grammar allows next can merge with the forced text's end."""
        if self._pre_tokenizer is None:
            return False
        matcher.fill_bitmask(self._probe, 0)
        words = self._probe[0]
        # Free text (a string's contents) allows thousands of tokens of every class:
        # count them first (a byte popcount) and give up early, before any unpacking.
        if int(_POPCOUNT[words.view(torch.uint8).long()].sum()) > _MAX_ALLOWED:
            return False
        token_ids = allowed_token_ids(words, self._vocab.vocab_size)
        classes = set(self._class_of[token_ids].tolist())
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
