"""The tokenizer's vocabulary as raw bytes: what every grammar backend matches against.

A grammar constrains *bytes*; a token's text from ``decode()`` is the wrong
thing to match, because a byte-level BPE token may hold half of a UTF-8
character (``decode`` turns it into U+FFFD). So each token id is mapped back to
the exact bytes it stands for:

    byte-level BPE (GPT-2, SmolLM2, Llama 3, Qwen)   'Ġthe' -> b' the' via the inverse
                                                     of GPT-2's byte <-> unicode table
    SentencePiece (Llama 2, Mistral)                 '▁the' -> b' the', '<0x0A>' -> b'\\n'

Special tokens (``<|im_start|>``, ...) and ids the tokenizer does not have (the
model's vocab may be padded past it) map to ``None``: no grammar may produce them.
EOS ids are kept apart: a backend allows them only where the grammar can end.

A request whose grammar must write some special tokens (a tool call's markers:
``[TOOL_CALLS]``, ``<|tool_call|>``, ``<|python_tag|>``) compiles over a *variant*:

    vocab.with_special_tokens(("[TOOL_CALLS]",))   those special tokens get their text's
                                                    bytes; its ``key`` names them

so the variant's grammars may produce them (as one token), and every other request's,
over the plain vocabulary, still never does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from radixlm.kernels.bitmask import bitmask_width

__all__ = ["TokenVocabulary", "special_tokens"]

_SPIECE_SPACE = "\u2581"  # '▁'
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@dataclass(frozen=True, eq=False)
class TokenVocabulary:
    """Raw bytes of every token id in ``[0, vocab_size)``.

    Attributes:
        token_bytes: ``token_bytes[i]`` is token i's bytes, or None for special,
            EOS and unused ids (never allowed by a grammar).
        eos_token_ids: the ids that end generation; allowed only in accepting states.
        vocab_size: the model's vocab (logits width), >= the tokenizer's length.
        key: identifies the tokenizer (and a variant's special tokens), for caches
            keyed by vocabulary.
        special: each special token's content -> its id (EOS ids left out): what
            ``with_special_tokens`` may give text.
    """

    token_bytes: tuple[bytes | None, ...]
    eos_token_ids: frozenset[int]
    vocab_size: int
    key: str
    special: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def from_tokenizer(
        cls, tokenizer: Any, vocab_size: int, eos_token_ids: frozenset[int]
    ) -> TokenVocabulary:
        """Builds it from a transformers fast tokenizer."""
        pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        special = special_tokens(tokenizer)
        special_ids = set(special.values())
        to_bytes = _byte_decoder(tokenizer)
        token_bytes: list[bytes | None] = [None] * vocab_size
        for i, piece in enumerate(pieces[:vocab_size]):
            if piece is not None and i not in special_ids and i not in eos_token_ids:
                token_bytes[i] = to_bytes(piece)
        key = f"{getattr(tokenizer, 'name_or_path', '')}:{len(pieces)}:{vocab_size}"
        named = {
            text: i for text, i in special.items() if i < vocab_size and i not in eos_token_ids
        }
        return cls(tuple(token_bytes), frozenset(eos_token_ids), vocab_size, key, named)

    def special_among(self, texts: Iterable[str]) -> tuple[str, ...]:
        """Those of ``texts`` that are special tokens here, sorted (a cache key part)."""
        return tuple(sorted({text for text in texts if text in self.special}))

    def with_special_tokens(self, texts: Iterable[str]) -> TokenVocabulary:
        """This vocabulary with the special tokens whose content is one of ``texts``
        spelling that content (texts that are no special token here are ignored); itself
        when none is. Its ``key`` names them, so caches keep the two apart."""
        found = self.special_among(texts)
        if not found:
            return self
        token_bytes = list(self.token_bytes)
        for text in found:
            token_bytes[self.special[text]] = text.encode()
        key = f"{self.key}+{'+'.join(found)}"
        return TokenVocabulary(
            tuple(token_bytes), self.eos_token_ids, self.vocab_size, key, self.special
        )

    @property
    def bitmask_width(self) -> int:
        """int32 words per bitmask row: ceil(vocab_size / 32)."""
        return bitmask_width(self.vocab_size)


def special_tokens(tokenizer: Any) -> dict[str, int]:
    """The tokenizer's special tokens: content -> id (its named ones, such as EOS, and
    every added token marked special)."""
    found: dict[str, int] = {}
    for i, added in getattr(tokenizer, "added_tokens_decoder", {}).items():
        if getattr(added, "special", False):
            found[str(added.content)] = int(i)
    ids = list(getattr(tokenizer, "all_special_ids", []))
    for text, i in zip(tokenizer.convert_ids_to_tokens(ids), ids, strict=True):
        if text is not None:
            found.setdefault(text, int(i))
    return found


def _byte_decoder(tokenizer: Any):
    """piece -> bytes for this tokenizer's kind of vocabulary."""
    return _byte_level_bytes if _is_byte_level(tokenizer) else _sentencepiece_bytes


def _byte_level_bytes(piece: str) -> bytes:
    table = _unicode_to_byte()
    try:
        return bytes(table[c] for c in piece)
    except KeyError:  # an added (non-special) token stored as plain text
        return piece.encode()


def _is_byte_level(tokenizer: Any) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    kinds = {decoder.get("type")} | {d.get("type") for d in decoder.get("decoders", [])}
    return "ByteLevel" in kinds


def _sentencepiece_bytes(piece: str) -> bytes:
    byte = _BYTE_TOKEN.fullmatch(piece)
    if byte:
        return bytes([int(byte.group(1), 16)])
    return piece.replace(_SPIECE_SPACE, " ").encode()


@cache
def _unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's byte -> printable-unicode table: printable Latin-1 bytes map to
    themselves; the other 68 bytes to U+0100 and up, in byte order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {chr(b): b for b in printable}
    others = [b for b in range(256) if b not in set(printable)]
    table.update({chr(0x100 + n): b for n, b in enumerate(others)})
    return table
