"""The stop-string automaton against a brute-force reading of its contract, fed in
any chunking; its size is linear in the stop strings."""

from __future__ import annotations

import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from radixlm.runtime.io.stop_strings import ROOT, StopStrings


def reference(stops: list[str], text: str) -> tuple[int, str] | None:
    """(end, stop) of the first stop to complete: the smallest end; at one end the
    longest stop; equal stops: the first listed."""
    best = None
    for i, stop in enumerate(stops):
        pos = text.find(stop)
        if pos < 0:
            continue
        key = (pos + len(stop), -len(stop), i)
        if best is None or key < best[0]:
            best = (key, stop)
    return None if best is None else (best[0][0], best[1])


def held_reference(stops: list[str], text: str) -> int:
    """The longest suffix of ``text`` that is a prefix of a stop (a whole stop counts
    only when it is a prefix of a longer one)."""
    return max(
        (k for s in stops for k in range(1, min(len(text), len(s)) + 1) if text.endswith(s[:k])),
        default=0,
    )


def feed(matcher: StopStrings, chunks: list[str]):
    """Feeds chunks in order: (end in the whole text, stop) of the match, else the state."""
    state, offset = ROOT, 0
    for chunk in chunks:
        state, match = matcher.scan(state, chunk)
        if match is not None:
            return (offset + match.end, match.stop), state
        offset += len(chunk)
    return None, state


alphabet = st.sampled_from("abc")
stops_st = st.lists(st.text(alphabet, min_size=1, max_size=5), min_size=1, max_size=4)


@settings(max_examples=400, deadline=None)
@given(stops=stops_st, text=st.text(alphabet, max_size=30), cuts=st.lists(st.integers(0, 30)))
def test_first_completed_stop_matches_the_reference_in_any_chunking(stops, text, cuts):
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    chunks = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    matcher = StopStrings(stops)
    found, state = feed(matcher, chunks)
    assert found == reference(stops, text)
    if found is None:
        assert matcher.held(state) == held_reference(stops, text)


def test_ties_at_one_end_go_to_the_longest_then_the_first_listed():
    assert feed(StopStrings(["cd", "bcd"]), ["abcd"])[0] == (4, "bcd")
    assert feed(StopStrings(["abcd", "bc"]), ["abcd"])[0] == (3, "bc")
    matcher = StopStrings(["x", "x"])
    assert matcher.scan(ROOT, "x")[1].stop == "x"


def test_text_without_any_stop_character_stays_at_the_root():
    matcher = StopStrings(["###"])
    assert matcher.scan(ROOT, "hello world") == (ROOT, None)
    assert not StopStrings([]) and StopStrings(["a"])


def test_memory_is_linear_in_the_stop_strings():
    """A million-character stop once took gigabytes (every prefix in a set)."""

    def size(length: int) -> int:
        tracemalloc.start()
        matcher = StopStrings(["y" * length])
        current = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        del matcher
        return current

    small, large = size(2_000), size(20_000)
    assert large < 12 * small  # 10x the characters: about 10x the memory, not 100x
    assert large < 200 * 20_000  # and under 200 bytes a character


def test_a_long_stop_matches_across_many_chunks():
    matcher = StopStrings(["y" * 5_000])
    found, state = feed(matcher, ["y" * 1_000] * 4 + ["y" * 999])
    assert found is None and matcher.held(state) == 4_999
    assert matcher.scan(state, "yz")[1].end == 1
