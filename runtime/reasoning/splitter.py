"""Splits a reply's text into its reasoning and its content, streamed or whole.

    feed("<think>\\nLet me") -> reasoning "Let me"
    feed(" count.\\n</th")   -> reasoning " count."        ("\\n</th" held: maybe the end)
    feed("ink>\\n\\n{\\"a\\"")  -> content '{"a"'            (leading whitespace dropped)

The whole-text split (``split``) is the same splitter fed once, so a stream's deltas
always concatenate to the whole-text result. Whitespace around the reasoning and
before the content is dropped (held back while it may still be that whitespace).

A section opens only at the reply's start (after whitespace), as the engine allows
it; ``first_block_anywhere`` lets the first ``start ... end`` block sit anywhere
(the DSL's ``separate_reasoning``: text before it stays content).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from radixlm.runtime.reasoning.formats import Phase, ReasoningFormat

__all__ = ["ReasoningDelta", "ReasoningSplitter", "split_reasoning"]

_SPACE = re.compile(r"\s*")  # \s is str.isspace: what str.strip drops


@dataclass(frozen=True)
class ReasoningDelta:
    """New reasoning text and new content text (either may be empty)."""

    reasoning: str = ""
    content: str = ""


@dataclass
class ReasoningSplitter:
    """One reply's split; ``phase``: where the reply starts (``opening_phase``)."""

    format: ReasoningFormat
    phase: Phase
    first_block_anywhere: bool = False
    _held: str = field(default="", init=False)
    _reasoning_begun: bool = field(default=False, init=False)  # its leading ws dropped
    _content_begun: bool = field(default=True, init=False)  # False right after the end marker

    def feed(self, text: str, final: bool = False) -> ReasoningDelta:
        """The split of ``text``, the reply's next piece; ``final``: the reply ends here
        (everything held back is released or, if whitespace, dropped)."""
        self._held += text
        reasoning: list[str] = []
        content: list[str] = []
        while self._step(reasoning, content, final):
            pass
        return ReasoningDelta("".join(reasoning), "".join(content))

    def _step(self, reasoning: list[str], content: list[str], final: bool) -> bool:
        """Moves held text out as far as it can be decided; True: call again."""
        if self.phase is Phase.MAY_OPEN:
            return self._may_open(content, final)
        if self.phase is Phase.REASONING:
            return self._reasoning(reasoning, final)
        self._content(content, final)
        return False

    def _may_open(self, content: list[str], final: bool) -> bool:
        if self.first_block_anywhere:
            return self._open_anywhere(content, final)
        start = self.format.start
        rest = self._held.lstrip()
        if rest.startswith(start):
            self._held = rest[len(start) :]
            self.phase = Phase.REASONING
            return True
        if start.startswith(rest) and not final:  # may still become the start marker
            return False
        self.phase = Phase.ANSWER
        return True

    def _open_anywhere(self, content: list[str], final: bool) -> bool:
        start = self.format.start
        at = self._held.find(start)
        if at >= 0:
            content.append(self._held[:at])
            self._held = self._held[at + len(start) :]
            self.phase = Phase.REASONING
            return True
        keep = 0 if final else _partial_suffix(self._held, start)
        content.append(self._held[: len(self._held) - keep])
        self._held = self._held[len(self._held) - keep :]
        return False

    def _reasoning(self, reasoning: list[str], final: bool) -> bool:
        if not self._reasoning_begun:  # its leading whitespace, and repeated start markers
            start = self.format.start
            self._held = self._held[_past_markers(self._held, start) :]  # one copy, not one each
            if start.startswith(self._held) and not final:
                return False
            self._reasoning_begun = True
        end = self.format.end
        at = self._held.find(end)
        if at >= 0:
            reasoning.append(self._held[:at].rstrip())
            self._held = self._held[at + len(end) :]
            self.phase = Phase.ANSWER
            self._content_begun = False
            return True
        if final:
            reasoning.append(self._held.rstrip())
            self._held = ""
            return False
        keep = _partial_suffix(self._held, end)
        safe = self._held[: len(self._held) - keep]
        sent = safe.rstrip()  # trailing whitespace waits: it may precede the end marker
        reasoning.append(sent)
        self._held = self._held[len(sent) :]
        return False

    def _content(self, content: list[str], final: bool) -> None:
        if not self._content_begun:
            self._held = self._held.lstrip()
            if not self._held and not final:
                return
            self._content_begun = True
        content.append(self._held)
        self._held = ""


def split_reasoning(
    text: str, format: ReasoningFormat, phase: Phase | None = None, anywhere: bool = False
) -> ReasoningDelta:
    """The whole reply ``text`` split (``phase``: where it starts; None: the format's
    default); the same result a stream of any pieces of ``text`` concatenates to."""
    splitter = ReasoningSplitter(format, phase or format.default_phase, anywhere)
    return splitter.feed(text, final=True)


def _past_markers(text: str, marker: str) -> int:
    """Where ``text`` goes on after its leading whitespace and every ``marker`` that
    repeats there (with whitespace around it). Linear, and a Python loop rather than
    one regex: a worker thread running it still lets the event loop take its turns."""
    at = _SPACE.match(text).end()
    while text.startswith(marker, at):
        at = _SPACE.match(text, at + len(marker)).end()
    return at


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of ``text`` that begins ``marker`` (shorter than it)."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
