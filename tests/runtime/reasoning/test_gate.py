"""ReasoningMatcher on a hand-made vocabulary: no mask while thinking, the end marker
found however it is spelled, the grammar fresh after it, the budget forcing the end."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels.bitmask import allowed_token_ids
from radixlm.runtime.constrained import TokenVocabulary
from radixlm.runtime.reasoning import Phase, ReasoningMarkers, ReasoningMatcher, reasoning_format

EOS, A, B, OPEN_PART, THINK, CLOSE_PART, END, LBRACE, RBRACE, START, CLOSE_NL = range(11)
PIECES = (None, b"a", b"b", b"</", b"think", b">", None, b"{", b"}", None, b">\n")
VOCAB = TokenVocabulary(PIECES, frozenset({EOS}), len(PIECES), "test")
FORMAT = reasoning_format("think")
# The markers as single special tokens (no bytes in the vocabulary: spelled by the markers).
SPECIAL = ReasoningMarkers(
    FORMAT, (START,), (END,), None, VOCAB, {START: b"<think>", END: b"</think>"}
)
# An end marker the tokenizer spells in three pieces.
PIECED = ReasoningMarkers(
    FORMAT, (START,), (OPEN_PART, THINK, CLOSE_PART), None, VOCAB, {START: b"<think>"}
)


class Braces:
    """A grammar matcher for "{}" then EOS (what the answer must be)."""

    def __init__(self) -> None:
        self.accepted: list[int] = []

    def _next(self) -> set[int]:
        return [{LBRACE}, {RBRACE}, {EOS}][min(len(self.accepted), 2)]

    def accept_token(self, token_id: int) -> bool:
        if token_id not in self._next():
            return False
        self.accepted.append(token_id)
        return True

    def rollback(self, num_tokens: int) -> None:
        del self.accepted[len(self.accepted) - num_tokens :]

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        bitmask[row].zero_()
        for token in self._next():
            bitmask[row, token // 32] |= 1 << token

    def is_terminal(self) -> bool:
        return len(self.accepted) == 2

    def forced_string(self) -> str:
        return "}" if self.accepted == [LBRACE] else ""


def allowed(matcher) -> set[int]:
    bitmask = torch.zeros(1, VOCAB.bitmask_width, dtype=torch.int32)
    matcher.fill_bitmask(bitmask, 0)
    return set(allowed_token_ids(bitmask[0], VOCAB.vocab_size).tolist())


def feed(matcher, tokens) -> None:
    for token in tokens:
        assert matcher.accept_token(token), token


EVERYTHING = set(range(len(PIECES)))


@pytest.mark.parametrize(
    ("markers", "spelling"),
    [
        (SPECIAL, [END]),  # one special token
        (PIECED, [OPEN_PART, THINK, CLOSE_PART]),  # the tokenizer's own pieces
        (SPECIAL, [OPEN_PART, THINK, CLOSE_NL]),  # another spelling, whitespace after it
    ],
)
def test_thinking_is_unmasked_and_the_grammar_starts_fresh_after_the_end(markers, spelling):
    inner = Braces()
    matcher = ReasoningMatcher(markers, inner, Phase.REASONING)
    assert allowed(matcher) == EVERYTHING - {EOS}  # a constrained answer must come
    feed(matcher, [A, RBRACE, B, *spelling[:-1]])  # anything, "}" included
    assert matcher.phase is Phase.REASONING and inner.accepted == []
    assert not matcher.is_terminal() and matcher.forced_string() == ""
    feed(matcher, spelling[-1:])
    assert matcher.phase is Phase.ANSWER and matcher.num_reasoning_tokens == 3 + len(spelling) - 1
    assert allowed(matcher) == {LBRACE}
    assert not matcher.accept_token(A)  # the grammar's refusal stands
    feed(matcher, [LBRACE, RBRACE])
    assert inner.accepted == [LBRACE, RBRACE] and matcher.is_terminal()


def test_the_budget_forces_the_end_markers_tokens_in_order():
    matcher = ReasoningMatcher(PIECED, Braces(), Phase.REASONING, max_reasoning_tokens=2)
    feed(matcher, [A, B])
    for token in (OPEN_PART, THINK, CLOSE_PART):
        assert allowed(matcher) == {token}
        assert not matcher.accept_token(A)  # nothing else passes
        feed(matcher, [token])
    assert matcher.phase is Phase.ANSWER and matcher.num_reasoning_tokens == 2
    assert allowed(matcher) == {LBRACE}


def test_a_budget_of_zero_answers_at_once():
    opened = ReasoningMatcher(SPECIAL, Braces(), Phase.REASONING, max_reasoning_tokens=0)
    assert allowed(opened) == {END}
    feed(opened, [END])
    assert opened.phase is Phase.ANSWER
    may_open = ReasoningMatcher(SPECIAL, Braces(), Phase.MAY_OPEN, max_reasoning_tokens=0)
    assert may_open.phase is Phase.ANSWER and allowed(may_open) == {LBRACE}


def test_at_the_start_the_model_may_open_a_section_or_answer():
    opening = ReasoningMatcher(SPECIAL, Braces(), Phase.MAY_OPEN)
    assert allowed(opening) == {LBRACE, START}
    feed(opening, [START, A, END])
    assert opening.phase is Phase.ANSWER and opening.num_reasoning_tokens == 1
    answering = ReasoningMatcher(SPECIAL, inner := Braces(), Phase.MAY_OPEN)
    feed(answering, [LBRACE])
    assert answering.phase is Phase.ANSWER and inner.accepted == [LBRACE]
    assert allowed(answering) == {RBRACE}


def test_jump_forward_waits_for_the_answers_first_token_and_never_rolls_back_thinking():
    matcher = ReasoningMatcher(SPECIAL, Braces(), Phase.REASONING)
    with pytest.raises(RuntimeError, match="reasoning is never rolled back"):
        matcher.rollback(1)
    feed(matcher, [A, END])
    assert matcher.forced_string() == ""
    feed(matcher, [LBRACE])
    assert matcher.forced_string() == "}"
    matcher.rollback(1)
    assert allowed(matcher) == {LBRACE}
    with pytest.raises(RuntimeError):
        matcher.rollback(1)


def test_an_answer_from_the_start_may_jump_forward_at_once():
    matcher = ReasoningMatcher(SPECIAL, inner := Braces(), Phase.ANSWER)
    inner.accepted.append(LBRACE)  # as if "{" were forced before the first token
    assert matcher.forced_string() == "}"


def test_a_budget_alone_leaves_the_reply_unconstrained():
    matcher = ReasoningMatcher(SPECIAL, None, Phase.REASONING, max_reasoning_tokens=1)
    assert allowed(matcher) == EVERYTHING  # EOS too: no answer is owed
    feed(matcher, [A])
    assert allowed(matcher) == {END}
    feed(matcher, [END, RBRACE, A])
    assert allowed(matcher) == EVERYTHING and not matcher.is_terminal()


def test_the_bit_of_token_31_is_set_and_cleared():
    vocab = TokenVocabulary((None,) * 40, frozenset({31}), 40, "wide")
    markers = ReasoningMarkers(FORMAT, (32,), (33,), None, vocab, {32: b"<think>", 33: b"</think>"})
    matcher = ReasoningMatcher(markers, Braces(), Phase.REASONING)
    bitmask = torch.zeros(1, vocab.bitmask_width, dtype=torch.int32)
    matcher.fill_bitmask(bitmask, 0)
    assert set(allowed_token_ids(bitmask[0], 40).tolist()) == set(range(40)) - {31}
