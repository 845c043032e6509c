"""Reasoning models: the thinking section before the answer (``<think>...</think>``).

    formats   ReasoningFormat per family (markers; does the template open the section),
              the registry ``--reasoning-parser NAME`` picks from, detection from a
              chat template
    gate      ReasoningMatcher: a request's grammar held back until the section ends
              (token ids; ``max_reasoning_tokens`` forces the end)
    splitter  ReasoningSplitter: reply text -> reasoning and content, streamed or whole
    effort    OpenAI's reasoning effort -> a budget of reasoning tokens

The runtime's HTTP routes and the DSL's ``separate_reasoning`` split with the same code.
"""

from radixlm.runtime.reasoning.effort import REASONING_EFFORTS, effort_budget
from radixlm.runtime.reasoning.formats import (
    AUTO,
    REASONING_FORMATS,
    Phase,
    ReasoningFormat,
    UnknownReasoningParserError,
    detect_reasoning_format,
    reasoning_format,
    resolve_reasoning_format,
)
from radixlm.runtime.reasoning.gate import ReasoningMarkers, ReasoningMatcher
from radixlm.runtime.reasoning.splitter import ReasoningDelta, ReasoningSplitter, split_reasoning

__all__ = [
    "AUTO",
    "REASONING_EFFORTS",
    "REASONING_FORMATS",
    "Phase",
    "ReasoningDelta",
    "ReasoningFormat",
    "ReasoningMarkers",
    "ReasoningMatcher",
    "ReasoningSplitter",
    "UnknownReasoningParserError",
    "detect_reasoning_format",
    "effort_budget",
    "reasoning_format",
    "resolve_reasoning_format",
    "split_reasoning",
]
