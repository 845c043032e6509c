"""Replies of a reasoning model on the HTTP routes: ``reasoning_content`` beside the content.

    engine text  "<think>\\nLet me see.\\n</think>\\n\\n{\\"a\\": 1}"
    chat message {"reasoning_content": "Let me see.", "content": "{\\"a\\": 1}"}
    chat deltas  {"reasoning_content": "Let me"} ... {"content": "{\\"a\\""} ...
    responses    a ``reasoning`` output item (``reasoning_text`` content), then the message

On by default when the engine has a reasoning parser (vLLM's and SGLang's default):
a request's ``separate_reasoning: false`` (SGLang) keeps the whole text as content;
``include_reasoning: false`` (vLLM) leaves the reasoning out. The split starts where
the engine's does (``ReasoningMarkers.opening_phase`` of the prompt), and the content
is what the engine constrained: for a JSON-schema request, the JSON alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from radixlm.runtime.io.messages import GenerateOutput
from radixlm.runtime.reasoning import (
    Phase,
    ReasoningDelta,
    ReasoningFormat,
    ReasoningMarkers,
    ReasoningSplitter,
    split_reasoning,
)

__all__ = ["ReasoningPlan", "reasoning_plan"]


@dataclass(frozen=True)
class ReasoningPlan:
    """How one call's replies are split: ``format``'s markers, starting in ``phase``;
    ``include``: whether the reasoning is returned (False: dropped); ``start_ids`` /
    ``end_ids``: the markers' tokens (to count reasoning tokens)."""

    format: ReasoningFormat
    phase: Phase
    include: bool = True
    start_ids: tuple[int, ...] = ()
    end_ids: tuple[int, ...] = ()

    def splitter(self) -> ReasoningSplitter:
        """A streaming split for one reply."""
        return ReasoningSplitter(self.format, self.phase)

    def split(self, out: GenerateOutput) -> tuple[GenerateOutput, str | None]:
        """``out`` with its text cut to the content, and its reasoning (None: none, or
        not to be returned)."""
        parts = split_reasoning(out.text, self.format, self.phase)
        return dataclasses.replace(out, text=parts.content), self.shown(parts)

    def num_reasoning_tokens(self, output_ids: Sequence[int]) -> int:
        """The output tokens before the end marker (all, if it never came) of a reply
        that starts in its reasoning or opens it; 0 for one that answers at once."""
        ids = list(output_ids)
        opened = ids[: len(self.start_ids)] == list(self.start_ids)
        if self.phase is Phase.ANSWER or (self.phase is Phase.MAY_OPEN and not opened):
            return 0
        n = len(self.end_ids)
        return next((i for i in range(len(ids)) if ids[i : i + n] == list(self.end_ids)), len(ids))

    def shown(self, parts: ReasoningDelta) -> str | None:
        """The reasoning a reply (or a delta) returns: None when empty or left out."""
        return parts.reasoning if self.include and parts.reasoning else None


def reasoning_plan(
    markers: ReasoningMarkers | None,
    prompt_ids: Sequence[int],
    separate: bool | None = None,
    include: bool | None = None,
) -> ReasoningPlan | None:
    """The plan for a call to an engine with ``markers`` (None: no reasoning parser, or
    ``separate`` false: no split) whose prompt is ``prompt_ids``."""
    if markers is None or separate is False:
        return None
    phase = markers.opening_phase(prompt_ids)
    return ReasoningPlan(
        markers.format, phase, include is not False, markers.start_ids, markers.end_ids
    )
