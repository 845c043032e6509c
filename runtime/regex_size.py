"""What a regex expands to, measured from its parse without compiling it.

A pattern's length does not bound its compiled size: a counted repeat is written out as
that many copies (``regex`` holds ~250 bytes a position: ``a{1000000}`` ~250 MB;
outlines' FSM for ``a{10000}`` takes seconds). ``expanded_size`` counts positions,
counted repeats multiplied through nesting:

    (ab|c){3}d{2,5}   ->   3 * (2 + 1)  +  5 * 1  =  14 positions

Both the stop-regex limit (``io/limits``) and the constraint limit
(``constrained/spec_limits``) read it.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from typing import Any

if sys.version_info >= (3, 11):
    from re import _parser as sre_parse
else:  # pragma: no cover - Python 3.10
    import sre_parse

__all__ = ["expanded_size"]

# Python's re and regex (VERSION0) share the syntax of counted repeats and groups.
_REPEATS = {
    getattr(sre_parse, name)
    for name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")
    if hasattr(sre_parse, name)
}
_COUNTED_REPEAT = re.compile(r"\{(\d*),?(\d*)\}")


def expanded_size(pattern: str, cap: int) -> int:
    """The positions ``pattern`` expands to: each character, class or anchor counts 1,
    a group what it holds, an alternation its branches together, and a repeat ``{m,n}``
    multiplies what it repeats by ``n`` (``m`` when unbounded; ``*``, ``+``, ``?`` by 1).
    Computed from Python's ``re`` parse, without compiling; a pattern ``re`` cannot
    parse (``regex``'s own syntax, ``\\p{L}``) counts its length times every counted
    repeat in it, an upper bound that stops growing past ``cap`` (it returns cap + 1).
    """
    try:
        return _size(sre_parse.parse(pattern))
    except (re.error, RecursionError, OverflowError, ValueError):
        size = max(len(pattern), 1)
        for low, high in _COUNTED_REPEAT.findall(pattern):
            size = min(size * max(int(low or 0), int(high or 0), 1), cap + 1)
        return size


def _size(items: Any) -> int:
    total = 0
    for op, arg in items:
        if op in _REPEATS:
            low, high, body = arg
            count = low if high == sre_parse.MAXREPEAT else high
            total += max(count, 1) * _size(body)
        else:
            total += max(sum(_size(sub) for sub in _subpatterns(arg)), 1)
    return total


def _subpatterns(arg: Any) -> Iterator[Any]:
    """The parsed groups inside one item's argument (a group, a branch's alternatives,
    a lookaround's body, a conditional's two arms)."""
    if isinstance(arg, sre_parse.SubPattern):
        yield arg
    elif isinstance(arg, list | tuple):
        for part in arg:
            yield from _subpatterns(part)
