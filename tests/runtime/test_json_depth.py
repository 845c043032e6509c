"""json_depth: brackets outside strings, in linear time."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixlm.runtime.json_depth import json_depth


def depth_of(value) -> int:
    if isinstance(value, list):
        return 1 + max(map(depth_of, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth_of, value.values()), default=0)
    return 0


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab\n'),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text('[]{}"\\a'), inner),
    max_leaves=20,
)


@given(json_values)
def test_equals_the_depth_of_the_parsed_value(value):
    assert json_depth(json.dumps(value)) == depth_of(value)


@pytest.mark.parametrize(
    ("text", "depth"),
    [("1", 0), ('"[[{"', 0), ("[]", 1), ('{"a": [1, {"b": "]]"}]}', 3), ('["\\\\", [[]]]', 3)],
)
def test_examples(text, depth):
    assert json_depth(text) == depth


def test_far_deeper_than_the_parser_can_read():
    text = "[" * 100_000 + "]" * 100_000
    assert json_depth(text) == 100_000
    with pytest.raises(RecursionError):
        json.loads(text)
