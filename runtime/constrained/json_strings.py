"""Bounded JSON strings: the ``maxLength`` a string gets where the schema gives none.

A JSON string left open runs as long as the model writes it; a small model, greedy,
often never closes one (``"description": "The city is a city is a city ...`` until
max_new_tokens). ``json_max_string_length`` (off by default: ``GrammarConfig``, per
request ``SamplingParams``) gives every string of a JSON schema (and of the schemas in a
structural tag or a tool's parameters) that the schema leaves unbounded a ``maxLength``
of that many characters::

    {"type": "string"}                      -> {"type": "string", "maxLength": N}
    {"type": "string", "maxLength": 500}    kept: the schema's own bound is the user's
    {"type": "string", "minLength": M > N}  -> maxLength M (never contradict the schema)
    {"type": ["string", "null"]}            llguidance: maxLength beside it (it applies
                                            string keywords to strings only); xgrammar
                                            and outlines-core apply them only beside
                                            "type": "string": left open there
    {} / free-form values                   the bounded JSON value of ``json_numbers``,
                                            its strings bounded (keys are not: below)
    enum / const                            already bounded: unchanged
    under not / if / contains / propertyNames   unchanged (bounding a negated schema
                                            widens what it allows)

Where the bound does not reach, by backend (each measured):

  - ``format``: its own grammar decides; no bound is added (llguidance intersects a
    format with maxLength, and "date-time" under maxLength 12 accepts nothing). The
    formats of fixed shape (date, time, date-time, uuid, ipv4, ...) end by themselves;
    email, uri and hostname may run long.
  - ``pattern``: llguidance intersects it with maxLength: the bound is the larger of N
    and the pattern's shortest match (so its shortest matches stay), and a pattern whose
    matches are N characters or fewer gets none, nor one Python's regex parser cannot
    read. xgrammar and outlines-core enforce only one of pattern / format / length on a
    string (``schema_check.check_string_families``): no bound is added there; the
    pattern decides.
  - object keys: a key of a listed property is fixed; keys of free-form objects (and
    ``additionalProperties`` / ``patternProperties``) are not bounded on llguidance and
    xgrammar. outlines-core spells every free string with one regex fragment, keys
    included (``bound_string_regex``), so its keys are bounded too.
  - outlines: the bound is put into its regex; a string of N characters is N states of
    its FSM, so a large N with many strings can pass ``grammar_max_states``, which then
    refuses the schema by name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from radixlm.runtime.constrained.registry import JsonSchemaSupport
from radixlm.runtime.errors import UnsupportedGrammarError

try:  # Python's own regex parser (the shortest and longest match of a pattern)
    from re import _parser as _regex_parser  # type: ignore[attr-defined]
except ImportError:  # Python 3.10
    import sre_parse as _regex_parser  # type: ignore[no-redef]

__all__ = ["MAX_STRING_LENGTH", "string_bound", "bound_string_regex"]

# The largest json_max_string_length accepted: a string past it is a document, not a
# field; and outlines' FSM grows by a state per character of it.
MAX_STRING_LENGTH = 16_384


def string_bound(node: dict, limit: int, support: JsonSchemaSupport) -> int | None:
    """The ``maxLength`` a string subschema ``node`` gets under ``limit``, or None where
    none is added (it has one, a format, or the backend would not honour it: module
    docstring). ``support.quiet_drops``: a backend that applies string keywords only
    beside ``"type": "string"`` and one of pattern / format / length (xgrammar)."""
    if "maxLength" in node or "format" in node:
        return None
    if support.quiet_drops and (node.get("type") != "string" or "pattern" in node):
        return None
    least = node.get("minLength", 0)
    if "pattern" in node:
        widths = _pattern_widths(node["pattern"])
        if widths is None or widths[1] <= limit:  # unreadable, or its matches fit already
            return None
        least = max(least, widths[0])
    return max(limit, least) if isinstance(least, int) else None


def _pattern_widths(pattern: Any) -> tuple[int, int] | None:
    """The shortest and longest match of ``pattern`` (a huge number where unbounded) as
    Python's regex parser reads it; None where it cannot read it (another dialect's
    syntax, such as ``\\p{L}``)."""
    if not isinstance(pattern, str):
        return None
    try:
        low, high = _regex_parser.parse(pattern).getwidth()
    except (re.error, RecursionError, OverflowError):
        return None
    return low, high


# ---- outlines: its regex -------------------------------------------------------------

# outlines-core 0.2.14 spells the characters of every JSON string with this fragment:
# ``*`` after it where the schema gives no length, ``{m,}`` for a minLength alone,
# ``{m,n}`` for both (free-form values and object keys included).
_OUTLINES_CHARS = r'([^"\\\x00-\x1F\x7F-\x9F]|\\["\\/bfnrt])'
_OPEN_STRING = re.compile(re.escape(_OUTLINES_CHARS) + r"(\*|\{(\d+),\})")


def bound_string_regex(regex: str, schema_text: str, limit: int) -> str:
    """outlines-core's regex for the schema ``schema_text`` with every string of no
    maximum length bounded to ``limit`` characters (or its minLength, if larger).

    Raises:
        UnsupportedGrammarError: a pattern of the schema holds outlines-core's own string
            regex, which would be bounded with the rest.
    """
    if any(_OUTLINES_CHARS in text for text in _texts(json.loads(schema_text))):
        raise UnsupportedGrammarError(
            "json_schema",
            f"a pattern holds {_OUTLINES_CHARS}, the regex outlines-core spells strings "
            "with, so the outlines backend cannot bound strings apart from it; use "
            "grammar_backend='llguidance', or leave json_max_string_length unset",
        )

    def bounded(match: re.Match[str]) -> str:
        least = int(match.group(2) or 0)
        return f"{_OUTLINES_CHARS}{{{least},{max(limit, least)}}}"

    return _OPEN_STRING.sub(bounded, regex)


def _texts(value: Any) -> Iterator[str]:
    """Every string in a JSON value (keys too), at any depth."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _texts(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _texts(item)
