"""How a token-level backend scores ``select``'s choices (``Runtime``,
``RuntimeEndpoint``): every choice's tokens, in one batch of prompt-only requests.

Choice c is scored on ``tokenize(text + c)`` as a whole: from the first position
``m`` where any choice's tokenization leaves the prompt's own, so a token merging
the prompt's last characters with a choice's first ones is scored, under the same
context ``ids[:m]`` for every choice (the radix cache computes that shared prefix
once)::

    prompt  "Answer:"         -> [..., "Answer", ":"]
    choice  " yes"  whole     -> [..., "Answer", ":", " yes"]      (scored: " yes")
    choice  ": no"  merged    -> [..., "Answer", "::", " no"]     (m moves left)

Unconditional scores (for ``unconditional_likelihood_normalized``) score the same
tokens ``ids[m:]`` with no prompt at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from radixlm.choices import ChoiceScores, TokenScore
from radixlm.runtime.io.messages import GenerateOutput, GenerateRequest
from radixlm.runtime.io.sampling_params import SamplingParams
from radixlm.runtime.mem_cache.radix_cache import common_prefix_len

__all__ = ["score_choices_by_tokens"]


class _TokenBackend(Protocol):
    def tokenize(self, text: str) -> list[int]: ...

    def generate(self, requests: Sequence[GenerateRequest]) -> list[GenerateOutput]: ...


def score_choices_by_tokens(
    backend: _TokenBackend, text: str, choices: Sequence[str], unconditional: bool
) -> ChoiceScores:
    """The scored tokens of each choice after ``text`` (see the module docstring)."""
    prompt = backend.tokenize(text)
    choice_ids = [backend.tokenize(text + c) for c in choices]
    m = min(common_prefix_len(prompt, ids) for ids in choice_ids)
    m = min(m, *(len(ids) - 1 for ids in choice_ids))  # every choice scores a token
    requests = [_scoring(ids, m) for ids in choice_ids]
    if unconditional:
        requests += [_scoring(ids[m:], 0) for ids in choice_ids]
    outputs = backend.generate(requests)
    n = len(choices)
    return ChoiceScores(
        tuple(choices),
        tuple(_scored_tokens(out, m) for out in outputs[:n]),
        tuple(_scored_tokens(out, 0) for out in outputs[n:]) if unconditional else None,
    )


def _scoring(ids: Sequence[int], start: int) -> GenerateRequest:
    """A prompt-only request reporting the logprobs of positions ``start ..``."""
    return GenerateRequest(
        input_ids=tuple(ids),
        sampling_params=SamplingParams(max_new_tokens=0),
        return_logprob=True,
        logprob_start_len=start,
    )


def _scored_tokens(out: GenerateOutput, start: int) -> tuple[TokenScore, ...]:
    """(logprob, id) of prompt positions ``start ..`` (position 0 has no logprob)."""
    computed = dict(out.prompt_logprobs)
    return tuple(
        (computed[p][0] if p in computed else None, out.prompt_ids[p])
        for p in range(start, len(out.prompt_ids))
    )
