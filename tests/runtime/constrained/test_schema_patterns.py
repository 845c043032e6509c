"""Two patterns are told apart where their automata share no string, read as the
validator reads them (a search, Python's ``$``), and never where a pattern could read
otherwise: every pair proven apart is checked on strings drawn from each pattern. A
pattern rewritten into syntax llguidance reads takes the same strings as before."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixlm.runtime.constrained.schema_patterns import (
    assertion_inside,
    patterns_apart,
    portable_pattern,
)

APART = [
    ("^u?int(8|16|24|256)?(\\[[0-9]*\\])*$", "^u?fixed(0x8|8x0|16x8)$"),
    ("^address(\\[[0-9]*\\])*$", "^bool(\\[[0-9]*\\])*$"),
    # literal suffixes after an unescaped dot (any character)
    ("^http://www.onvif.org/Position$", "^http://www.onvif.org/Velocity$"),
    # a relative path (no leading /, no drive colon) and an absolute one
    ("^([a-zA-Z][^:]|[^/@a-zA-Z])[^/]*(/[^/]+)*$", "^([a-zA-Z]:)?/(([^/]+/)*[^/]+)?$"),
    ("^[0-9]+%$", "^[0-9]+(px|em)$"),
    # class escapes, read as Python reads them (Unicode) or wider
    ("^\\d{4}-\\d{2}$", "^\\d{2}:\\d{2}$"),
    ("^\\d+$", "^x$"),
    ("^[^\\d]+$", "^[0-9]+$"),
    ("^\\w+$", "^-+$"),
    ("^\\S+$", "^ *$"),
]

OVERLAP = [
    ("APPROVER", "SIGNER"),  # unanchored: "APPROVER SIGNER" matches both
    ("^a", "b$"),  # "ab"
    ("^a$", "^a\\n$"),  # "a\n": Python's $ matches before a last newline
    ("^[a-z]+$", "^abc"),
    ("x", "^[^y]*$"),
    # Python's classes are Unicode: an Arabic-Indic digit, a letter with an accent, a
    # file separator are \d, \w, \s
    ("^\\d+$", "^\u0663$"),
    ("^\\w+$", "^\u00e9$"),
    ("^\\s$", "^\x1c$"),
    ("^[\\d_]+$", "^\u0663_$"),
]

NOT_READ = [
    ("^\\bx$", "^y$"),  # a word boundary
    ("^[]x]$", "^y$"),  # a class ECMA-262 reads otherwise
    ("^a$|^b$", "^c$"),  # anchors inside
    ("(?i)^a$", "^A$"),  # a flag: both match "A"
    ("^(?=a)a$", "^b$"),  # a lookaround
    ("^a{20000}$", "^b$"),  # a repeat past the bound (NFA states)
    ("a" * 5000, "b"),  # a pattern past the length bound
    ("^[a-z", "^b$"),  # not a regex
]


@pytest.mark.parametrize(("a", "b"), APART)
def test_patterns_that_share_no_string_are_apart(a, b):
    assert patterns_apart(a, b) and patterns_apart(b, a)


@pytest.mark.parametrize(("a", "b"), OVERLAP)
def test_patterns_that_share_a_string_are_not(a, b):
    assert not patterns_apart(a, b) and not patterns_apart(b, a)


@pytest.mark.parametrize(("a", "b"), NOT_READ)
def test_patterns_that_may_read_otherwise_prove_nothing(a, b):
    assert not patterns_apart(a, b) and not patterns_apart(b, a)


def test_only_two_strings_are_compared():
    assert not patterns_apart({"pattern": "^a$"}, "^b$") and not patterns_apart(None, "^b$")
    assert patterns_apart("^a$", "^b$")


@pytest.mark.parametrize(("a", "b"), APART)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_no_string_of_one_matches_the_other(a, b, data):
    for mine, theirs in ((a, b), (b, a)):
        text = data.draw(st.from_regex(mine))
        assert re.search(mine, text) and not re.search(theirs, text), (mine, text)


REWRITTEN = [
    (
        "^(\\/?((\\.{2})|([a-z0-9\\-]*))($|\\/))*$",
        "^(?:(?:\\/?((\\.{2})|([a-z0-9\\-]*))\\/)*\\/?((\\.{2})|([a-z0-9\\-]*))(?:\\/)?)?$",
    ),
    ("^([a-z]+($|,))+$", "^(?:(?:[a-z]+,)*[a-z]+(?:,)?)$"),
    ("^.+\\<.+@.+\\..+\\>$", "^.+<.+@.+\\..+>$"),
]
UNCHANGED = [
    "^(a|b($|/))+$",  # the anchor's group is one alternative's, not the body's
    "^(?:a($|/))+$",  # a group of its own kind
    "^(a)($|b)$",  # not repeated
    "^a\\\\<b$",  # an escaped backslash, then <
]


@pytest.mark.parametrize(("pattern", "rewritten"), REWRITTEN)
def test_patterns_llguidance_misreads_are_rewritten(pattern, rewritten):
    assert portable_pattern(pattern) == rewritten


@pytest.mark.parametrize("pattern", UNCHANGED)
def test_patterns_outside_those_forms_are_left_alone(pattern):
    assert portable_pattern(pattern) == pattern


@pytest.mark.parametrize(("pattern", "rewritten"), REWRITTEN)
@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_a_rewritten_pattern_takes_the_same_strings(pattern, rewritten, data):
    for mine, theirs in ((pattern, rewritten), (rewritten, pattern)):
        text = data.draw(st.from_regex(mine, fullmatch=True).filter(lambda t: "\n" not in t))
        assert bool(re.search(mine, text)) == bool(re.search(theirs, text)), (mine, text)


@pytest.mark.parametrize(
    ("pattern", "found"),
    [
        ("^(?!@@)[@a-z]+$", "a lookaround"),
        ("^[a-z]+(?<!x)$", "a lookaround"),
        ("^$[a-z]*$", "an anchor inside it"),
        ("^(a|b$)c", "an anchor inside it"),
        ("x(a|^b)", "an anchor inside it"),
        # anchors at the edge of a top-level alternative, group brackets aside
        ("^a$|^b$", None),
        ("^$|^[a-z]+$", None),
        ("x(?:a|$)", None),
        ("(^a)b", None),
        ("^(/[a-z]+)*(/|$)", None),
        ("[$^]", None),  # in a class: characters
        ("a\\$b", None),  # escaped
    ],
)
def test_assertions_a_regex_engine_may_ignore_are_found(pattern, found):
    assert assertion_inside(pattern) == found
