"""The interface every grammar backend implements: compile once, then a cursor per request.

    GrammarSpec --GrammarBackend.compile--> CompiledGrammar      (cached, shared)
                                              --new_matcher--> GrammarMatcher (one per request)

A matcher's state is "the output so far". The scheduler owns it: it fills the
request's bitmask row before each sampling step, then accepts the sampled
token (or the jump-forward tokens).
"""

from __future__ import annotations

from typing import Protocol

import torch

from radixlm.runtime.constrained.spec import GrammarSpec

__all__ = ["GrammarBackend", "CompiledGrammar", "GrammarMatcher"]


class GrammarMatcher(Protocol):
    """One request's position in its grammar."""

    def accept_token(self, token_id: int) -> bool:
        """Advances over ``token_id``; False (state unchanged) if the grammar forbids it."""
        ...

    def rollback(self, num_tokens: int) -> None:
        """Undoes the last ``num_tokens`` accepted tokens."""
        ...

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Writes the allowed next tokens into row ``row`` of an int32 (R, W) CPU bitmask
        (bit t % 32 of word t // 32). EOS is set only where the output may end."""
        ...

    def is_terminal(self) -> bool:
        """Whether the output so far is complete and nothing but EOS may follow."""
        ...

    def forced_string(self) -> str:
        """The text the grammar forces next (whole characters; '' if none): what
        jump-forward appends without decoding."""
        ...


class CompiledGrammar(Protocol):
    """A compiled constraint, shared by every request that uses the same spec."""

    @property
    def backend(self) -> str: ...

    @property
    def warnings(self) -> tuple[str, ...]:
        """What a lenient JSON-schema read dropped (one line per keyword); else empty."""
        ...

    def new_matcher(self) -> GrammarMatcher: ...


class GrammarBackend(Protocol):
    """Turns specs into compiled grammars over one vocabulary.

    ``compile`` runs in a compile worker process, never on the engine loop; it raises
    ``GrammarError`` (naming the field) for a spec it cannot serve. ``export`` turns
    its result into plain picklable data there, and ``load`` rebuilds it in the engine
    process (quickly: the work was the compile).
    """

    name: str
    kinds: frozenset[str]

    def compile(self, spec: GrammarSpec) -> CompiledGrammar: ...

    def export(self, compiled: CompiledGrammar) -> object: ...

    def load(self, exported: object) -> CompiledGrammar: ...
