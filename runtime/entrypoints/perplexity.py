"""Perplexity of a text under an engine's model: what a dtype or a quantization costs.

The method is llama.cpp's ``perplexity`` tool's, so the figures compare with it:
the text's tokens are cut into consecutive windows of ``context`` tokens (the last,
partial one dropped); each window runs as one prompt, and the second half of its
positions is scored, every scored token having at least ``context / 2`` tokens
before it. Perplexity is exp(mean negative log-likelihood) over all scored tokens.
The windows go to the engine as one batch (prompt logprobs from position
``context / 2``), so they prefill side by side.

``radixlm perplexity`` runs it from the shell on the public-domain text shipped in
``benchmarks/data`` (Shakespeare's *The Tempest*) unless given another.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

__all__ = ["DEFAULT_TEXT", "Perplexity", "PerplexityError", "measure_perplexity", "text_windows"]

DEFAULT_TEXT = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "tempest.txt"


class PerplexityError(ValueError):
    """The text or the window asked for cannot be scored."""


class _Engine(Protocol):
    tokenizer: object

    def generate(self, *args: object, **kwargs: object) -> object: ...


@dataclass(frozen=True)
class Perplexity:
    """perplexity: exp(nll); nll: mean negative log-likelihood per scored token (nats);
    num_scored_tokens: tokens scored (``num_windows`` x ``context / 2``)."""

    perplexity: float
    nll: float
    num_scored_tokens: int
    num_windows: int
    context: int

    def describe(self) -> str:
        return (
            f"perplexity {self.perplexity:.4f} (nll {self.nll:.5f}) over "
            f"{self.num_scored_tokens} tokens: {self.num_windows} windows of {self.context}, "
            "second halves scored"
        )


def measure_perplexity(
    engine: _Engine, text: str, context: int = 512, max_windows: int | None = None
) -> Perplexity:
    """Scores ``text`` (see the module doc) with the engine's model.

    Args:
        context: tokens per window (even, at least 4).
        max_windows: score only the first this many windows (None: all).

    Raises:
        PerplexityError: an odd or too small ``context``, or a text shorter than one window.
    """
    windows = text_windows(engine.tokenizer, text, context, max_windows)
    outputs = engine.generate(
        input_ids=windows,
        sampling_params={"max_new_tokens": 1, "temperature": 0},
        return_logprob=True,
        logprob_start_len=context // 2,
    )
    logprobs = [lp for out in outputs for lp, _, _ in out["meta_info"]["input_token_logprobs"]]  # type: ignore[union-attr, index]
    nll = -math.fsum(logprobs) / len(logprobs)
    return Perplexity(math.exp(nll), nll, len(logprobs), len(windows), context)


def text_windows(
    tokenizer: object, text: str, context: int, max_windows: int | None = None
) -> list[list[int]]:
    """The text's token ids in consecutive windows of ``context`` (the last, partial
    one dropped), at most ``max_windows`` of them.

    Raises:
        PerplexityError: an odd or too small ``context``, or a text shorter than one window.
    """
    if context < 4 or context % 2:
        raise PerplexityError(f"context must be an even number of tokens >= 4, got {context}")
    ids = tokenizer(text, add_special_tokens=False, verbose=False).input_ids  # type: ignore[operator]
    num_windows = len(ids) // context
    if max_windows is not None:
        num_windows = min(num_windows, max_windows)
    if num_windows < 1:
        raise PerplexityError(f"the text has {len(ids)} tokens, fewer than one window of {context}")
    return [ids[i * context : (i + 1) * context] for i in range(num_windows)]
