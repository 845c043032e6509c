"""The three choices methods on crafted scores, called with SGLang's keywords: each
picks what its rule says and reports SGLang's meta info keys; a user-written
method is SGLang's base class shape."""

from __future__ import annotations

import math

import pytest

import radixlm as sgl
from radixlm.choices import ChoiceScores, ChoicesDecision, ChoicesSamplingMethod

# "ab": 2 tokens, mean -1.0, first token -1.5; "c": 1 token -1.2; "de": mean -1.1, first -0.5
SCORES = ChoiceScores(
    ("ab", "c", "de"),
    (((-1.5, 1), (-0.5, 2)), ((-1.2, 3),), ((-0.5, 4), (-1.7, 5))),
    (((None, 1), (-0.1, 2)), ((None, 3),), ((None, 4), (-0.2, 5))),
)
ARGS = SCORES.method_arguments()
SGLANG_KEYS = {"normalized_prompt_logprobs", "input_token_logprobs", "output_token_logprobs"}


def test_method_arguments_are_sglangs_keywords():
    assert set(ARGS) == {
        "choices",
        "normalized_prompt_logprobs",
        "input_token_logprobs",
        "output_token_logprobs",
        "unconditional_token_logprobs",
    }
    assert ARGS["choices"] == ["ab", "c", "de"]
    assert ARGS["normalized_prompt_logprobs"] == pytest.approx([-1.0, -1.2, -1.1])
    assert ARGS["input_token_logprobs"][0] == [(-1.5, 1, None), (-0.5, 2, None)]
    assert ARGS["output_token_logprobs"] == [[], [], []]
    assert ARGS["unconditional_token_logprobs"][2] == [(None, 4, None), (-0.2, 5, None)]
    without = ChoiceScores(SCORES.choices, SCORES.token_logprobs).method_arguments()
    assert without["unconditional_token_logprobs"] is None


def test_token_length_normalized_takes_the_best_mean():
    decision = sgl.token_length_normalized(**ARGS)
    assert decision.decision == "ab"
    assert set(decision.meta_info) == SGLANG_KEYS
    assert decision.meta_info["input_token_logprobs"][1] == [(-1.2, 3, None)]


def test_greedy_token_selection_takes_the_best_first_token():
    decision = sgl.greedy_token_selection(**ARGS)
    assert decision.decision == "de"  # -0.5 first, although its mean is lower than "ab"'s
    assert set(decision.meta_info) == SGLANG_KEYS | {"greedy_logprob_matrix"}
    assert decision.meta_info["greedy_logprob_matrix"][1] == [-1.2, -1.2]  # padded by its mean


def test_unconditional_normalization_subtracts_the_no_prompt_scores():
    assert sgl.unconditional_likelihood_normalized.requires_unconditional_logprobs is True
    assert sgl.token_length_normalized.requires_unconditional_logprobs is False
    decision = sgl.unconditional_likelihood_normalized(**ARGS)
    # ab: (-1.5 - 0 + -0.5 + 0.1) / 2 = -0.95; c: -1.2; de: (-0.5 + -1.5) / 2 = -1.0
    assert decision.decision == "ab"
    assert set(decision.meta_info) == SGLANG_KEYS | {
        "unconditional_token_logprobs",
        "normalized_unconditional_prompt_logprobs",
    }
    normalized = decision.meta_info["normalized_unconditional_prompt_logprobs"]
    assert normalized == pytest.approx([-0.95, -1.2, -1.0])
    with pytest.raises(ValueError, match="needs unconditional"):
        sgl.unconditional_likelihood_normalized(**{**ARGS, "unconditional_token_logprobs": None})
    short = [[(None, 1, None)], [(None, 3, None)], [(None, 4, None)]]
    with pytest.raises(ValueError, match="2 conditional but 1 unconditional"):
        sgl.unconditional_likelihood_normalized(**{**ARGS, "unconditional_token_logprobs": short})


def test_sglang_shaped_calls_take_json_lists_and_no_unconditional_keyword():
    """As SGLang's RuntimeEndpoint calls them: entries are [logprob, id, text] lists."""
    decision = sgl.greedy_token_selection(
        choices=["x", "y"],
        normalized_prompt_logprobs=[-2.0, -1.0],
        input_token_logprobs=[[[-2.0, 7, "x"]], [[-1.0, 8, "y"]]],
        output_token_logprobs=[[], []],
    )
    assert decision == ChoicesDecision("y", decision.meta_info)
    assert decision.meta_info["greedy_logprob_matrix"] == [[-2.0], [-1.0]]


def test_a_method_is_sglangs_abstract_base_class():
    class Incomplete(ChoicesSamplingMethod):
        pass

    with pytest.raises(TypeError, match="abstract"):
        Incomplete()

    class Last(ChoicesSamplingMethod):
        def __call__(self, *, choices, **_):
            return ChoicesDecision(choices[-1])

    last = Last()
    assert last.requires_unconditional_logprobs is False
    assert last(**ARGS) == ChoicesDecision("de", None)
    with pytest.raises(TypeError):
        last(SCORES)  # keywords only, as SGLang


def test_an_empty_score_is_minus_infinity():
    assert ChoiceScores(("a",), ((),)).normalized_prompt_logprobs == [-math.inf]
