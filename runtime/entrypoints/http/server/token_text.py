"""Each token id's text and raw bytes, for the logprobs the server reports.

A byte-level BPE token may hold half of a UTF-8 character, so its text alone
cannot say what it stands for: OpenAI's ``bytes`` field carries the exact bytes
(from the tokenizer's byte table, the vocabulary the grammar backends use). Its
``token`` text decodes those bytes, with U+FFFD for a split character. Special
tokens (``<|im_end|>``) have no bytes in that table; they read as the tokenizer
writes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixlm.runtime.constrained import TokenVocabulary

__all__ = ["TokenTexts"]


@dataclass(frozen=True, eq=False)
class TokenTexts:
    """Read-only after construction; shared by every request of a server."""

    tokenizer: Any
    vocab: TokenVocabulary

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> TokenTexts:
        vocab = TokenVocabulary.from_tokenizer(tokenizer, len(tokenizer), frozenset())
        return cls(tokenizer, vocab)

    def token_bytes(self, token_id: int) -> bytes:
        raw = self.vocab.token_bytes[token_id] if 0 <= token_id < self.vocab.vocab_size else None
        if raw is None:
            return self.tokenizer.decode([token_id]).encode("utf-8")
        return raw

    def text(self, token_id: int) -> str:
        return self.token_bytes(token_id).decode("utf-8", errors="replace")
