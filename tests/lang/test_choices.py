"""The three choices methods on crafted scores: each picks what its rule says."""

from __future__ import annotations

import math

import pytest

import radixlm as sgl
from radixlm.choices import ChoiceScores

# "ab": 2 tokens, mean -1.0, first token -1.5; "c": 1 token -1.2; "de": mean -1.1, first -0.5
SCORES = ChoiceScores(
    ("ab", "c", "de"),
    (((-1.5, 1), (-0.5, 2)), ((-1.2, 3),), ((-0.5, 4), (-1.7, 5))),
    (((None, 1), (-0.1, 2)), ((None, 3),), ((None, 4), (-0.2, 5))),
)


def test_token_length_normalized_takes_the_best_mean():
    decision = sgl.token_length_normalized(SCORES)
    assert decision.decision == "ab"
    assert decision.meta_info["normalized_prompt_logprobs"] == pytest.approx([-1.0, -1.2, -1.1])
    assert decision.meta_info["input_token_logprobs"][1] == [(-1.2, 3, None)]


def test_greedy_token_selection_takes_the_best_first_token():
    decision = sgl.greedy_token_selection(SCORES)
    assert decision.decision == "de"  # -0.5 first, although its mean is lower than "ab"'s
    assert decision.meta_info["greedy_logprob_matrix"][1] == [-1.2, -1.2]  # padded by its mean


def test_unconditional_normalization_subtracts_the_no_prompt_scores():
    decision = sgl.unconditional_likelihood_normalized(SCORES)
    # ab: (-1.5 - 0 + -0.5 + 0.1) / 2 = -0.95; c: -1.2; de: (-0.5 + -1.5) / 2 = -1.0
    assert decision.decision == "ab"
    normalized = decision.meta_info["normalized_unconditional_prompt_logprobs"]
    assert normalized == pytest.approx([-0.95, -1.2, -1.0])
    with pytest.raises(ValueError, match="needs unconditional"):
        sgl.unconditional_likelihood_normalized(ChoiceScores(SCORES.choices, SCORES.token_logprobs))


def test_an_empty_score_is_minus_infinity():
    assert ChoiceScores(("a",), ((),)).normalized_prompt_logprobs == [-math.inf]
