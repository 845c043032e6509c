"""Why an output was cut at the token limit: what its unfinished JSON was doing.

    ...,"notes":"The city is a city is a city is a ci        string   (endless string)
    ...,"area":12.2611822222222222222222                     number   (endless number)
    ...,"tags":["a","b","b","b","b",                          repeat   (repeated items)
    anything else (deep nesting, or just long)               other

A cut text ends inside a string literal of at least ``ENDLESS_STRING_CHARS`` characters,
or inside a number of at least ``ENDLESS_NUMBER_DIGITS`` digits (past what a double
holds), or has an open array whose last ``REPEATS`` complete items are the same text
(an object: the same values, whatever their keys), checked from the innermost open
container out. The first that holds is the cause.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["CUT_CAUSES", "ENDLESS_NUMBER_DIGITS", "ENDLESS_STRING_CHARS", "REPEATS",
           "cut_cause", "cut_cause_counts"]  # fmt: skip

CUT_CAUSES = ("string", "number", "repeat", "other")
ENDLESS_STRING_CHARS = 64
ENDLESS_NUMBER_DIGITS = 16
REPEATS = 3
_TRAILING_NUMBER = re.compile(r"-?[0-9][0-9.eE+-]*$")
_KEY = re.compile(r'^\s*"(?:[^"\\]|\\.)*"\s*:')


@dataclass
class _Open:
    """An open array or object: where its current item starts, and its complete items."""

    bracket: str
    item_start: int
    items: list[str] = field(default_factory=list)


@dataclass
class _Scan:
    """Where a JSON text stops: its open containers, and the open string's start."""

    stack: list[_Open]
    string_start: int | None


def cut_cause(text: str) -> str:
    """The cause (one of ``CUT_CAUSES``) of the cut JSON ``text`` (module docstring)."""
    scan = _scan(text)
    if scan.string_start is not None:
        if len(text) - scan.string_start - 1 >= ENDLESS_STRING_CHARS:
            return "string"
    else:
        number = _TRAILING_NUMBER.search(text)
        if number and sum(c.isdigit() for c in number.group()) >= ENDLESS_NUMBER_DIGITS:
            return "number"
    if any(_repeats(frame) for frame in reversed(scan.stack)):
        return "repeat"
    return "other"


def cut_cause_counts(outcomes: Iterable) -> dict[str, Counter]:
    """backend -> how many of its outputs cut at the token limit (status "length") had
    each cause; every cause counted, zeros included."""
    counts: dict[str, Counter] = {}
    for outcome in outcomes:
        if outcome.status == "length":
            row = counts.setdefault(outcome.backend, Counter(dict.fromkeys(CUT_CAUSES, 0)))
            row[cut_cause(outcome.text)] += 1
    return counts


def _scan(text: str) -> _Scan:
    stack: list[_Open] = []
    string_start: int | None = None
    escaped = False
    for i, char in enumerate(text):
        if string_start is not None:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                string_start = None
        elif char == '"':
            string_start = i
        elif char in "[{":
            stack.append(_Open(char, i + 1))
        elif char in "]}" and stack:
            stack.pop()
        elif char == "," and stack:
            frame = stack[-1]
            frame.items.append(text[frame.item_start : i].strip())
            frame.item_start = i + 1
    return _Scan(stack, string_start)


def _repeats(frame: _Open) -> bool:
    """Whether the last ``REPEATS`` complete items are the same (an object's: values)."""
    tail = frame.items[-REPEATS:]
    if len(tail) < REPEATS:
        return False
    if frame.bracket == "{":
        tail = [_KEY.sub("", item, count=1).strip() for item in tail]
    return len(set(tail)) == 1
