"""schema_coverage/cut_causes.py: why an output was cut at the token limit."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
from schema_coverage.cut_causes import (  # noqa: E402
    ENDLESS_NUMBER_DIGITS,
    ENDLESS_STRING_CHARS,
    cut_cause,
    cut_cause_counts,
)
from schema_coverage.outcomes import SchemaOutcome  # noqa: E402

LONG = "a city is " * (ENDLESS_STRING_CHARS // 10 + 1)


@pytest.mark.parametrize(
    ("text", "cause"),
    [
        ('{"name":"Paris","notes":"' + LONG, "string"),
        ('{"notes":["' + LONG, "string"),
        ('{"escaped":"say \\"' + LONG, "string"),  # an escaped quote does not end it
        ('{"area":12.' + "2" * ENDLESS_NUMBER_DIGITS, "number"),
        ('{"n":[1,-' + "9" * ENDLESS_NUMBER_DIGITS, "number"),
        ('{"tags":["a","b","b","b","b",', "repeat"),
        ('{"tags":["a","b","b","b","c', "repeat"),  # the complete items repeat
        ('[{"x":1},{"x":1},{"x":1},{"x":', "repeat"),
        ('{"a":[1],"b":[1],"c":[1],"d":[', "repeat"),  # object values, keys differ
        ('{"tags":["a","b","a","b",', "other"),
        ('{"notes":"short', "other"),  # a short open string
        ('{"n":12345', "other"),  # a short number
        ('{"s":"x,x,x,x,x,x', "other"),  # commas inside a string are no items
        ('{"a":{"b":{"c":{"d":{"e":', "other"),
        ("", "other"),
    ],
)
def test_cut_cause(text, cause):
    assert cut_cause(text) == cause


def test_cut_cause_counts_only_cut_outputs_per_backend():
    def outcome(backend, status, text):
        return SchemaOutcome(dataset="d", name="n", backend=backend, status=status, text=text)

    outcomes = [
        outcome("llguidance", "length", '{"a":"' + LONG),
        outcome("llguidance", "length", '{"a":"' + LONG),
        outcome("llguidance", "length", '["x","x","x",'),
        outcome("llguidance", "valid", '{"a":"' + LONG),
        outcome("xgrammar", "length", '{"a":{'),
    ]
    counts = cut_cause_counts(outcomes)
    assert counts["llguidance"] == {"string": 2, "number": 0, "repeat": 1, "other": 0}
    assert counts["xgrammar"] == {"string": 0, "number": 0, "repeat": 0, "other": 1}
