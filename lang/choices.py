"""How ``select`` picks among its choices from their token logprobs, under SGLang's
interface (``radixlm.choices`` stands for ``sglang.lang.choices``).

A method is called with keywords only and returns a ``ChoicesDecision``::

    method(choices=["yes", "no"],
           normalized_prompt_logprobs=[-0.3, -1.9],          # mean per choice
           input_token_logprobs=[[(lp, token_id, None), ...], ...],
           output_token_logprobs=[[], []],                   # scoring generates nothing
           unconditional_token_logprobs=None | [[(lp, token_id, None), ...], ...])
        -> ChoicesDecision(decision="yes", meta_info={...})  # meta_info: the select's

A backend scores each choice on the tokenization of prompt + choice as a whole
(``ChoiceScores``; see ``backends/scoring.py``): ``input_token_logprobs[i]`` lists
every token of choice i's scored span, which starts at the first token where the
choices' tokenizations leave the prompt's own (so a token that merges the prompt's
last characters with a choice's first ones is scored, for every choice alike).
``unconditional_token_logprobs`` (the same tokens scored with no prompt; the first
has no logprob: None) is given only to a method whose
``requires_unconditional_logprobs`` is True.

Three methods, under SGLang's names:

- ``token_length_normalized`` (default): the highest mean token logprob.
- ``greedy_token_selection``: token by token, keep the choices with the highest
  logprob at that position (a shorter choice continues at its own mean) until one
  is left; the first of the survivors otherwise.
- ``unconditional_likelihood_normalized``: the highest mean of (conditional -
  unconditional) token logprobs (the unconditional first token counts 0).

Write another by subclassing ``ChoicesSamplingMethod`` and pass an instance as
``select(..., choices_method=...)``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

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
# (logprob, token id, token text): SGLang's entry; radixlm leaves the text None
TokenLogprob = tuple[float | None, int, str | None]


@dataclass(frozen=True)
class ChoiceScores:
    """What a backend's ``score_choices`` returns: the scored tokens of every choice,
    in choice order."""

    choices: tuple[str, ...]
    token_logprobs: tuple[tuple[TokenScore, ...], ...]
    unconditional_token_logprobs: tuple[tuple[TokenScore, ...], ...] | None = None

    @property
    def normalized_prompt_logprobs(self) -> list[float]:
        return [_mean([lp for lp, _ in tokens]) for tokens in self.token_logprobs]

    def method_arguments(self) -> dict[str, Any]:
        """The keyword arguments a ``ChoicesSamplingMethod`` is called with."""
        unconditional = self.unconditional_token_logprobs
        return {
            "choices": list(self.choices),
            "normalized_prompt_logprobs": self.normalized_prompt_logprobs,
            "input_token_logprobs": _entries(self.token_logprobs),
            "output_token_logprobs": [[] for _ in self.choices],
            "unconditional_token_logprobs": None
            if unconditional is None
            else _entries(unconditional),
        }


@dataclass(frozen=True)
class ChoicesDecision:
    """The picked choice, and what the select's ``get_meta_info`` returns."""

    decision: str
    meta_info: dict[str, Any] | None = None


class ChoicesSamplingMethod(ABC):
    """A way to pick a choice (SGLang's base class): subclass it, override
    ``__call__`` (keywords as in the module docstring), and ``requires_unconditional_logprobs``
    to return True when the method reads ``unconditional_token_logprobs``."""

    @property
    def requires_unconditional_logprobs(self) -> bool:
        return False

    @abstractmethod
    def __call__(
        self,
        *,
        choices: list[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[list[TokenLogprob]],
        output_token_logprobs: list[list[TokenLogprob]],
        unconditional_token_logprobs: list[list[TokenLogprob]] | None = None,
    ) -> ChoicesDecision:
        """The decision (one of ``choices``) and the select's meta info."""


def _entries(scores: tuple[tuple[TokenScore, ...], ...]) -> list[list[TokenLogprob]]:
    return [[(lp, tok, None) for lp, tok in tokens] for tokens in scores]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else -math.inf


def _argmax_first(values: list[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)


def _meta(
    normalized: list[float],
    inputs: list[list[TokenLogprob]],
    outputs: list[list[TokenLogprob]],
    **extra: Any,
) -> dict[str, Any]:
    return {
        "normalized_prompt_logprobs": normalized,
        "input_token_logprobs": inputs,
        "output_token_logprobs": outputs,
        **extra,
    }


class TokenLengthNormalized(ChoicesSamplingMethod):
    def __call__(
        self,
        *,
        choices: list[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[list[TokenLogprob]],
        output_token_logprobs: list[list[TokenLogprob]],
        unconditional_token_logprobs: list[list[TokenLogprob]] | None = None,
    ) -> ChoicesDecision:
        best = _argmax_first(normalized_prompt_logprobs)
        meta = _meta(normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs)
        return ChoicesDecision(choices[best], meta)


class GreedyTokenSelection(ChoicesSamplingMethod):
    def __call__(
        self,
        *,
        choices: list[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[list[TokenLogprob]],
        output_token_logprobs: list[list[TokenLogprob]],
        unconditional_token_logprobs: list[list[TokenLogprob]] | None = None,
    ) -> ChoicesDecision:
        rows = [[token[0] for token in tokens] for tokens in input_token_logprobs]
        width = max(len(r) for r in rows)
        matrix = [r + [_mean(r)] * (width - len(r)) for r in rows]
        remaining = list(range(len(rows)))
        for j in range(width):
            best = max(matrix[i][j] for i in remaining)
            remaining = [i for i in remaining if matrix[i][j] == best]
            if len(remaining) == 1:
                break
        meta = _meta(
            normalized_prompt_logprobs,
            input_token_logprobs,
            output_token_logprobs,
            greedy_logprob_matrix=matrix,
        )
        return ChoicesDecision(choices[remaining[0]], meta)


class UnconditionalLikelihoodNormalized(ChoicesSamplingMethod):
    @property
    def requires_unconditional_logprobs(self) -> bool:
        return True

    def __call__(
        self,
        *,
        choices: list[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[list[TokenLogprob]],
        output_token_logprobs: list[list[TokenLogprob]],
        unconditional_token_logprobs: list[list[TokenLogprob]] | None = None,
    ) -> ChoicesDecision:
        """The best mean of (conditional - unconditional) token logprobs.

        Raises:
            ValueError: no unconditional logprobs, or not one per conditional token.
        """
        if unconditional_token_logprobs is None:
            raise ValueError("unconditional_likelihood_normalized needs unconditional logprobs")
        normalized = []
        for cond, uncond in zip(input_token_logprobs, unconditional_token_logprobs, strict=True):
            if len(cond) != len(uncond):
                raise ValueError(
                    f"{len(cond)} conditional but {len(uncond)} unconditional token logprobs"
                )
            normalized.append(_mean([c[0] - (u[0] or 0.0) for c, u in zip(cond, uncond)]))
        meta = _meta(
            normalized_prompt_logprobs,
            input_token_logprobs,
            output_token_logprobs,
            unconditional_token_logprobs=unconditional_token_logprobs,
            normalized_unconditional_prompt_logprobs=normalized,
        )
        return ChoicesDecision(choices[_argmax_first(normalized)], meta)


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()
