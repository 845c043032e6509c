"""A request's constraint held back behind its reasoning section, on token ids.

    prompt ... <think>\\n | thinking, any token ...  </think> | {"answer": 3} <eos>
                          ^ REASONING: no mask      ^ end     ^ ANSWER: the grammar, fresh

``ReasoningMatcher`` wraps the request's ``GrammarMatcher`` (or none, when only
``max_reasoning_tokens`` is asked) and is one itself, so the scheduler, the batch
builder and jump-forward use it as any matcher:

- REASONING: every token is allowed (a constrained request's EOS excepted: its answer
  must come). The end marker is recognised on the tokens' bytes, so it counts however
  the model spells it (one special token, or ``</``, ``think``, ``>``). Then the
  grammar starts from its initial state: it never saw the reasoning tokens.
- ``max_reasoning_tokens`` reached: the end marker's tokens are forced, one a step
  (the mask allows only the next one), and the answer starts.
- MAY_OPEN (the model may open a section itself, Qwen3): the first token may be the
  start marker's first token besides what the grammar allows; taking it opens the
  section (the marker's other tokens are forced), anything else is the answer's.

``rollback`` reaches only into the answer (jump-forward's use); after a section,
jump-forward waits for the answer's first sampled token, so it never re-tokenises the
end marker.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from radixlm.runtime.constrained.base import GrammarMatcher
from radixlm.runtime.constrained.vocab import TokenVocabulary
from radixlm.runtime.reasoning.formats import Phase, ReasoningFormat

__all__ = ["ReasoningMarkers", "ReasoningMatcher"]

# Prompt tokens decoded to find where a reply starts (the last marker in them).
_PROMPT_TAIL_TOKENS = 256
_UNSPELLED = b"\0"  # a special or unused token: never part of a marker


@dataclass(frozen=True, eq=False)
class ReasoningMarkers:
    """A format's markers in one tokenizer: the ids that spell them (the tokenizer's
    own spelling, what is forced) and every token's bytes (what detection reads).

    Build with ``from_tokenizer``; shared by every request of an engine.
    """

    format: ReasoningFormat
    start_ids: tuple[int, ...]
    end_ids: tuple[int, ...]
    tokenizer: Any = field(repr=False)
    vocab: TokenVocabulary = field(repr=False)
    _marker_bytes: dict[int, bytes] = field(default_factory=dict, repr=False)

    @classmethod
    def from_tokenizer(
        cls, fmt: ReasoningFormat, tokenizer: Any, vocab: TokenVocabulary
    ) -> ReasoningMarkers:
        start_ids = tuple(tokenizer.encode(fmt.start, add_special_tokens=False))
        end_ids = tuple(tokenizer.encode(fmt.end, add_special_tokens=False))
        if not start_ids or not end_ids:
            raise ValueError(f"the tokenizer spells no tokens for {fmt.name}'s markers")
        # Special tokens have no bytes in the vocabulary; the markers' own pieces do.
        spelled = {}
        for ids, text in ((start_ids, fmt.start), (end_ids, fmt.end)):
            for t in ids:
                if vocab.token_bytes[t] is None:
                    piece = text if len(ids) == 1 else tokenizer.convert_ids_to_tokens(t)
                    spelled[t] = piece.encode()
        return cls(fmt, start_ids, end_ids, tokenizer, vocab, spelled)

    def spell(self, token: int) -> bytes:
        """The bytes token ``token`` stands for (a NUL for one that stands for none)."""
        if 0 <= token < len(self.vocab.token_bytes):
            piece = self.vocab.token_bytes[token]
            if piece is not None:
                return piece
        return self._marker_bytes.get(token, _UNSPELLED)

    def opening_phase(self, prompt_ids: Sequence[int]) -> Phase:
        """Where a reply to ``prompt_ids`` starts (``ReasoningFormat.opening_phase`` on
        the text of its last 256 tokens)."""
        tail = list(prompt_ids[-_PROMPT_TAIL_TOKENS:])
        text = self.tokenizer.decode(tail, skip_special_tokens=False)
        return self.format.opening_phase(text)


class ReasoningMatcher:
    """A request's position in its reasoning section, then in its grammar.

    Args:
        markers: the engine's ``ReasoningMarkers``.
        inner: the request's grammar matcher (None: no constraint, only the budget).
        phase: where the reply starts (``ReasoningMarkers.opening_phase``).
        max_reasoning_tokens: the most reasoning tokens before the end is forced
            (None: no bound; 0: the answer starts at once).
    """

    def __init__(
        self,
        markers: ReasoningMarkers,
        inner: GrammarMatcher | None,
        phase: Phase,
        max_reasoning_tokens: int | None = None,
    ) -> None:
        self._markers = markers
        self._inner = inner
        self._max = max_reasoning_tokens
        self._end = markers.format.end.encode()
        self._phase = phase
        self._forced: list[int] = []  # marker tokens still to force, in order
        self._after_forced = phase  # the phase once they are in
        self._tail = b""  # the reasoning's last bytes, short of one whole end marker
        self._num_answer_tokens = 0  # what the inner matcher has accepted
        self.num_reasoning_tokens = 0
        if max_reasoning_tokens == 0:
            if phase is Phase.REASONING:
                self._force(markers.end_ids, Phase.ANSWER)
            elif phase is Phase.MAY_OPEN:
                self._phase = Phase.ANSWER
        self._answered_at_once = self._phase is Phase.ANSWER  # no end marker to protect

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def in_answer(self) -> bool:
        """In the answer, no marker token pending: what is accepted now can be rolled
        back (speculative proposals are walked through the gate and undone)."""
        return self._answering()

    def accept_token(self, token_id: int) -> bool:
        if self._forced:
            if token_id != self._forced[0]:
                return False
            self._forced.pop(0)
            self._observe(token_id, counted=False)
            if not self._forced:
                self._phase = self._after_forced
            return True
        if self._phase is Phase.MAY_OPEN:
            if token_id == self._markers.start_ids[0]:
                self._phase = Phase.REASONING
                self._force(self._markers.start_ids[1:], Phase.REASONING)
                return True
            self._phase = Phase.ANSWER
        if self._phase is Phase.REASONING:
            self._observe(token_id, counted=True)
            return True
        if self._inner is not None and not self._inner.accept_token(token_id):
            return False
        self._num_answer_tokens += 1
        return True

    def rollback(self, num_tokens: int) -> None:
        if self._phase is not Phase.ANSWER or num_tokens > self._num_answer_tokens:
            raise RuntimeError(
                f"cannot roll back {num_tokens} tokens: only {self._num_answer_tokens} "
                "answer tokens were accepted (the reasoning is never rolled back)"
            )
        if self._inner is not None:
            self._inner.rollback(num_tokens)
        self._num_answer_tokens -= num_tokens

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        if self._forced:
            bitmask[row].zero_()
            _set_bit(bitmask[row], self._forced[0], True)
        elif self._phase is Phase.REASONING:
            bitmask[row].fill_(-1)
            if self._inner is not None:  # a constrained reply must reach its answer
                for eos in self._markers.vocab.eos_token_ids:
                    _set_bit(bitmask[row], eos, False)
        else:
            self._fill_answer(bitmask, row)
            if self._phase is Phase.MAY_OPEN:
                _set_bit(bitmask[row], self._markers.start_ids[0], True)

    def is_terminal(self) -> bool:
        return self._answering and self._inner is not None and self._inner.is_terminal()

    def forced_string(self) -> str:
        # After a section, only from the answer's first token on: jump-forward must not
        # re-tokenise the end marker (its rollback would reach into the reasoning).
        if not self._answering or self._inner is None:
            return ""
        if self._num_answer_tokens == 0 and not self._answered_at_once:
            return ""
        return self._inner.forced_string()

    @property
    def _answering(self) -> bool:
        return self._phase is Phase.ANSWER and not self._forced

    def _fill_answer(self, bitmask: torch.Tensor, row: int) -> None:
        if self._inner is None:
            bitmask[row].fill_(-1)
        else:
            self._inner.fill_bitmask(bitmask, row)

    def _force(self, tokens: Sequence[int], then: Phase) -> None:
        self._forced, self._after_forced = list(tokens), then

    def _observe(self, token_id: int, counted: bool) -> None:
        """A reasoning token: the section ends where its bytes complete the end marker
        (as the text splitter splits at its first occurrence; bytes after it in the
        same token, whitespace in practice, are the answer's but unseen by the grammar)."""
        if self._phase is not Phase.REASONING:
            return
        window = self._tail + self._markers.spell(token_id)
        if self._end in window:
            self._phase, self._forced, self._tail = Phase.ANSWER, [], b""
            return
        self._tail = window[-(len(self._end) - 1) :] if len(self._end) > 1 else b""
        if counted:
            self.num_reasoning_tokens += 1
            if self._max is not None and self.num_reasoning_tokens >= self._max:
                self._force(self._markers.end_ids, Phase.ANSWER)


def _set_bit(row: torch.Tensor, token: int, allowed: bool) -> None:
    """Sets or clears token ``token``'s bit in a (W,) int32 bitmask row."""
    if not 0 <= token < row.shape[0] * 32:
        return
    word, bit = divmod(token, 32)
    value = int(row[word]) & 0xFFFFFFFF
    value = value | (1 << bit) if allowed else value & ~(1 << bit)
    row[word] = value - (1 << 32) if value >= 1 << 31 else value
