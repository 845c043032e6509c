"""expanded_size: what a regex expands to, from its parse."""

import pytest

from radixlm.runtime.regex_size import expanded_size


@pytest.mark.parametrize(
    ("pattern", "size"),
    [
        ("abc", 3),
        ("(ab|c){3}d{2,5}", 14),  # 3 x (2 + 1) + 5
        ("a{1000000}", 1_000_000),
        ("(a{1000}){1000}", 1_000_000),
        ("(?:x{10}){10,}", 100),  # unbounded: its minimum
        (r"a*b+c?[a-z]\d", 5),
        ("(?=ab)c(?<!x{4})", 7),
        (r"\p{L}{3}", 24),  # only regex parses \p{..}: its length times the repeats
    ],
)
def test_expanded_size_multiplies_counted_repeats_through_nesting(pattern, size):
    assert expanded_size(pattern, 10_000_000) == size


def test_an_unparsed_patterns_bound_stops_growing_past_the_cap():
    assert expanded_size(r"\p{L}{99999}{99999}", 100) == 101
