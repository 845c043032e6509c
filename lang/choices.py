"""How ``select`` picks among its choices from their token logprobs.

Each choice arrives scored on the tokenization of prompt + choice as a whole (see
``interpreter.py``): ``token_logprobs[i]`` holds (logprob, token id) for every token
of choice i's scored span, the span starting at the first token where the choices'
tokenizations leave the prompt's own (so a token that merges the prompt's last
characters with a choice's first ones is scored, for every choice alike).

Three methods, under SGLang's names:

- ``token_length_normalized`` (default): the highest mean token logprob.
- ``greedy_token_selection``: token by token, keep the choices with the highest
  logprob at that position (a shorter choice continues at its own mean) until one
  is left; the first of the survivors otherwise.
- ``unconditional_likelihood_normalized``: the highest mean of (conditional -
  unconditional) token logprobs, the unconditional ones scoring the same tokens
  with no prompt at all (the first token has none: it counts 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = [
    "ChoiceScores",
    "ChoicesDecision",
    "ChoicesSamplingMethod",
    "GreedyTokenSelection",
    "TokenLengthNormalized",
    "UnconditionalLikelihoodNormalized",
    "greedy_token_selection",
    "token_length_normalized",
    "unconditional_likelihood_normalized",
]

# (logprob, token id); the unconditional first token's logprob is None
TokenScore = tuple[float | None, int]


@dataclass(frozen=True)
class ChoiceScores:
    """The scored tokens of every choice, in choice order."""

    choices: tuple[str, ...]
    token_logprobs: tuple[tuple[TokenScore, ...], ...]
    unconditional_token_logprobs: tuple[tuple[TokenScore, ...], ...] | None = None

    @property
    def normalized_prompt_logprobs(self) -> list[float]:
        return [_mean([lp for lp, _ in tokens]) for tokens in self.token_logprobs]


@dataclass(frozen=True)
class ChoicesDecision:
    decision: str
    meta_info: dict[str, Any] = field(default_factory=dict)


class ChoicesSamplingMethod(Protocol):
    @property
    def requires_unconditional_logprobs(self) -> bool: ...

    def __call__(self, scores: ChoiceScores) -> ChoicesDecision: ...


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else -math.inf


def _argmax_first(values: list[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)


def _meta(scores: ChoiceScores, **extra: Any) -> dict[str, Any]:
    return {
        "normalized_prompt_logprobs": scores.normalized_prompt_logprobs,
        "input_token_logprobs": [
            [(lp, tok, None) for lp, tok in tokens] for tokens in scores.token_logprobs
        ],
        "output_token_logprobs": [[] for _ in scores.choices],
        **extra,
    }


class TokenLengthNormalized:
    requires_unconditional_logprobs = False

    def __call__(self, scores: ChoiceScores) -> ChoicesDecision:
        best = _argmax_first(scores.normalized_prompt_logprobs)
        return ChoicesDecision(scores.choices[best], _meta(scores))


class GreedyTokenSelection:
    requires_unconditional_logprobs = False

    def __call__(self, scores: ChoiceScores) -> ChoicesDecision:
        rows = [[lp for lp, _ in tokens] for tokens in scores.token_logprobs]
        width = max(len(r) for r in rows)
        matrix = [r + [_mean(r)] * (width - len(r)) for r in rows]
        remaining = list(range(len(rows)))
        for j in range(width):
            best = max(matrix[i][j] for i in remaining)
            remaining = [i for i in remaining if matrix[i][j] == best]
            if len(remaining) == 1:
                break
        meta = _meta(scores, greedy_logprob_matrix=matrix)
        return ChoicesDecision(scores.choices[remaining[0]], meta)


class UnconditionalLikelihoodNormalized:
    requires_unconditional_logprobs = True

    def __call__(self, scores: ChoiceScores) -> ChoicesDecision:
        unconditional = scores.unconditional_token_logprobs
        if unconditional is None:
            raise ValueError("unconditional_likelihood_normalized needs unconditional logprobs")
        normalized = []
        for cond, uncond in zip(scores.token_logprobs, unconditional, strict=True):
            diffs = [c - (u or 0.0) for (c, _), (u, _) in zip(cond, uncond, strict=True)]
            normalized.append(_mean(diffs))
        meta = _meta(
            scores,
            unconditional_token_logprobs=[
                [(lp, tok, None) for lp, tok in tokens] for tokens in unconditional
            ],
            normalized_unconditional_prompt_logprobs=normalized,
        )
        return ChoicesDecision(scores.choices[_argmax_first(normalized)], meta)


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()
