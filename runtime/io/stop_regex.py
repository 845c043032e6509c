"""A request's ``stop_regex`` patterns: generation ends at the first match in the
output text, which is trimmed there as at a stop string.

Matching uses the ``regex`` module for two things ``re`` lacks: a *partial* match (text
ending in something that may still grow into a match, which must be held back from
the stream, as a stop string's prefix is) and a time limit per search, so a pattern
that backtracks badly costs its request, not the engine loop.

    unstreamed text: "... the answer is 4"   pattern r"answer is \\d+\\."
    full match?      none yet
    partial match?   "answer is 4" (may become "answer is 4."): held back from there

Bounds: a search looks at the text not yet streamed, at most ``WINDOW`` characters (a
partial match older than that is streamed after all), so each search costs O(WINDOW);
a match longer than ``WINDOW`` may be missed. Compiled once per request, shared by its
samples.

A pattern's length does not bound its compiled size (``regex`` writes a counted repeat
out as that many copies): ``runtime/regex_size.py`` measures it for the limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import regex

from radixlm.runtime.errors import InvalidSamplingParamsError

__all__ = ["RegexScan", "StopRegexes", "StopRegexTimeout"]

WINDOW = 1024  # characters of unstreamed text a search may hold back and look at
SEARCH_TIMEOUT_S = 0.05


class StopRegexTimeout(Exception):
    """A search ran past ``SEARCH_TIMEOUT_S``: the pattern backtracks too much."""


@dataclass(frozen=True)
class RegexScan:
    """One search over unstreamed text: the first full match (``start``, ``end``,
    ``pattern``; None if none), and from where the text must be held back."""

    match: tuple[int, int, str] | None
    hold_from: int


class StopRegexes:
    """``patterns`` compiled; raises InvalidSamplingParamsError for one that is not valid."""

    def __init__(self, patterns: Sequence[str]) -> None:
        self.patterns = tuple(patterns)
        self._compiled = [_compile(p) for p in self.patterns]

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def scan(self, text: str) -> RegexScan:
        """Searches ``text`` (the unstreamed output) for every pattern.

        Raises:
            StopRegexTimeout: a search took longer than its limit.
        """
        best: tuple[int, int, str] | None = None
        hold = len(text)
        for pattern, compiled in zip(self.patterns, self._compiled):
            full = _search(compiled, text, partial=False)
            if full is not None and (best is None or full.end() < best[1]):
                best = (full.start(), full.end(), pattern)
            partial = _search(compiled, text, partial=True)
            if partial is not None and partial.partial:
                hold = min(hold, partial.start())
        return RegexScan(best, max(hold, len(text) - WINDOW))


def _compile(pattern: str) -> regex.Pattern:
    try:
        return regex.compile(pattern, regex.VERSION0)
    except (regex.error, ValueError, OverflowError, RecursionError) as e:
        raise InvalidSamplingParamsError(
            "stop_regex", f"{pattern!r} is not a valid regex: {e}"
        ) from e


def _search(compiled: regex.Pattern, text: str, partial: bool) -> regex.Match | None:
    try:
        return compiled.search(text, partial=partial, timeout=SEARCH_TIMEOUT_S)
    except TimeoutError as e:
        raise StopRegexTimeout(
            f"stop_regex {compiled.pattern!r} took over {SEARCH_TIMEOUT_S:g} s to search "
            f"{len(text)} characters"
        ) from e
