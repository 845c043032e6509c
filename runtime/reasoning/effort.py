"""OpenAI's reasoning effort as a local model honours it: a budget of reasoning tokens.

    effort     none   minimal   low    medium   high
    budget     0      256       1,024  4,096    16,384

A budget ends the reasoning section once that many tokens are in it (the end marker is
forced: ``max_reasoning_tokens``, radixlm.runtime.reasoning.gate); "none" answers at
once. The tokens count in the reply's output budget too, so ``max_tokens`` bounds
both. A request that gives ``max_reasoning_tokens`` itself has that budget whatever
its effort. Chat completions take ``reasoning_effort``, the Responses API
``reasoning.effort``; both also reach the chat template as ``reasoning_effort`` (the
variable templates such as gpt-oss's read).
"""

from __future__ import annotations

__all__ = ["REASONING_EFFORTS", "effort_budget"]

REASONING_EFFORTS: dict[str, int] = {
    "none": 0,
    "minimal": 256,
    "low": 1024,
    "medium": 4096,
    "high": 16384,
}


def effort_budget(effort: str) -> int:
    """The reasoning-token budget of ``effort``.

    Raises:
        ValueError: an effort not in ``REASONING_EFFORTS``, naming them.
    """
    if effort not in REASONING_EFFORTS:
        raise ValueError(
            f"reasoning effort must be one of {', '.join(REASONING_EFFORTS)}, got {effort!r}"
        )
    return REASONING_EFFORTS[effort]
