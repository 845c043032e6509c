"""How deeply JSON text nests, found without parsing it.

Python's ``json`` parser recurses once per nesting level and raises ``RecursionError``
near a thousand; a request may carry JSON as text (a schema, a tool call's arguments)
nested far deeper than that. ``json_depth`` reads such text in linear time at C speed
(a regex drops the strings, ``translate`` keeps the brackets, ``accumulate`` sums them),
so the depth can be checked against a limit before anything parses it.
"""

from __future__ import annotations

import re
from itertools import accumulate

__all__ = ["json_depth"]

# A JSON string literal (escapes included); linear: each quote starts at most one scan.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_OPEN, _CLOSE = "[{", "]}"
# translate() keeps only brackets, as 1 (open) and 2 (close).
_BRACKETS = {c: None for c in range(0x80)} | {ord(c): "\x01" for c in _OPEN}
_BRACKETS |= {ord(c): "\x02" for c in _CLOSE}
_STEP = {"\x01": 1, "\x02": -1}


class _KeepBrackets(dict):
    """A ``str.translate`` table that drops every character but brackets."""

    def __missing__(self, key: int) -> None:
        return None


_TABLE = _KeepBrackets(_BRACKETS)


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in ``text`` (0 for a scalar).

    Brackets inside strings do not count. Text that is not JSON still gets a number
    (its brackets' deepest running count); parsing it then reports what is wrong.
    """
    brackets = _STRING.sub("", text).translate(_TABLE)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)
