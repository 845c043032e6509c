"""Prompt lookup and radix continuations: exact proposals on built histories, and the
incremental index against a brute-force rescan on random ones."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixlm.runtime.mem_cache.radix_cache import DisabledCache, RadixCache
from radixlm.runtime.speculative.ngram import (
    NgramConfig,
    NgramIndex,
    NgramProposer,
    Proposal,
    ProposalSource,
    cached_continuation,
)


def lookup(history: list[int], k: int = 4, min_ngram: int = 1, max_ngram: int = 3) -> tuple:
    return NgramIndex(min_ngram, max_ngram, history).lookup(k)


def reference_lookup(history: list[int], k: int, min_ngram: int, max_ngram: int) -> tuple:
    """Rescans the whole history: the latest start s of the suffix with s + n < T."""
    t = len(history)
    for n in range(min(max_ngram, t), min_ngram - 1, -1):
        suffix = history[t - n :]
        for s in range(t - n - 1, -1, -1):
            if history[s : s + n] == suffix:
                seq = list(history)
                for i in range(k):
                    seq.append(seq[s + n + i])
                return tuple(seq[t:])
    return ()


def cache_with(*sequences: list[int]) -> RadixCache:
    cache = RadixCache(lambda slots: None)
    for ids in sequences:
        cache.insert(ids, torch.arange(len(ids)))
    return cache


# --- prompt lookup ------------------------------------------------------------------


def test_copies_what_followed_the_suffix() -> None:
    assert lookup([1, 2, 3, 4, 5, 9, 1, 2, 3]) == (4, 5, 9, 1)


def test_no_earlier_occurrence_proposes_nothing() -> None:
    assert lookup([1, 2, 3, 4]) == ()
    assert lookup([]) == ()
    assert lookup([7]) == ()


def test_most_recent_occurrence_wins() -> None:
    # (1, 2) was followed by 7 and later by 8: the later one is copied, and the copy
    # runs on into the tokens it proposes (distance 3: 8 1 2 8).
    assert lookup([1, 2, 7, 1, 2, 8, 1, 2], max_ngram=2) == (8, 1, 2, 8)


def test_longer_suffix_wins_over_a_more_recent_shorter_one() -> None:
    history = [5, 1, 2, 7, 1, 2, 8, 5, 1, 2]
    assert lookup(history, max_ngram=3) == (7, 1, 2, 8)
    assert lookup(history, max_ngram=2) == (8, 5, 1, 2)


def test_overlapping_matches_repeat_the_period() -> None:
    assert lookup([7, 7, 7, 7]) == (7, 7, 7, 7)
    assert lookup([1, 2, 1, 2, 1]) == (2, 1, 2, 1)


def test_k_caps_the_proposal() -> None:
    history = [1, 2, 3, 4, 5, 9, 1, 2, 3]
    assert lookup(history, k=2) == (4, 5)
    assert lookup(history, k=0) == ()


def test_min_ngram_rejects_shorter_matches() -> None:
    history = [4, 9, 3, 5, 9]  # only the 1-gram (9,) occurred before
    assert lookup(history, min_ngram=1) == (3, 5, 9, 3)
    assert lookup(history, min_ngram=2) == ()


def test_extend_and_truncate_match_a_fresh_index() -> None:
    index = NgramIndex(1, 3, [1, 2, 3, 1, 2])
    index.extend([9, 1, 2])
    assert index.lookup(3) == (9, 1, 2)
    index.truncate(5)
    assert index.token_ids == [1, 2, 3, 1, 2]
    assert index.lookup(3) == (3, 1, 2)
    assert index._starts == NgramIndex(1, 3, [1, 2, 3, 1, 2])._starts
    with pytest.raises(ValueError, match="cannot truncate"):
        index.truncate(6)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 3), max_size=30),
    st.lists(st.integers(0, 3), max_size=10),
    st.integers(0, 40),
    st.integers(1, 3),
    st.integers(0, 2),
)
def test_incremental_index_equals_a_rescan(
    prompt: list[int], more: list[int], cut: int, min_ngram: int, extra: int
) -> None:
    max_ngram = min_ngram + extra
    index = NgramIndex(min_ngram, max_ngram, prompt)
    history = list(prompt)
    for token in more:
        index.extend([token])
        history.append(token)
        assert index.lookup(5) == reference_lookup(history, 5, min_ngram, max_ngram)
    cut = min(cut, len(history))
    index.truncate(cut)
    assert index.lookup(5) == reference_lookup(history[:cut], 5, min_ngram, max_ngram)


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="num_tokens"):
        NgramConfig(num_tokens=0)
    with pytest.raises(ValueError, match="min_ngram"):
        NgramConfig(min_ngram=3, max_ngram=2)
    with pytest.raises(ValueError, match="min_ngram"):
        NgramIndex(0, 2)


# --- radix continuations ----------------------------------------------------------


def test_continuation_of_a_fully_cached_sequence() -> None:
    cache = cache_with([1, 2, 3, 4, 5, 6])
    assert cached_continuation(cache, [1, 2, 3], 4) == (4, 5, 6)
    assert cached_continuation(cache, [1, 2, 3], 2) == (4, 5)
    assert cached_continuation(cache, [1, 2, 3, 4, 5, 6], 2) == ()


def test_no_continuation_unless_the_whole_sequence_is_cached() -> None:
    cache = cache_with([1, 2, 3, 4, 5, 6])
    assert cached_continuation(cache, [1, 2, 9], 4) == ()
    assert cached_continuation(cache, [2, 3], 4) == ()
    assert cached_continuation(cache, [], 4) == ()
    assert cached_continuation(DisabledCache(lambda slots: None), [1, 2], 4) == ()


def test_continuation_runs_across_nodes_and_takes_the_longest_branch() -> None:
    cache = cache_with([1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 9])  # split after 1 2 3
    assert cached_continuation(cache, [1, 2], 4) == (3, 4, 5, 6)
    assert cached_continuation(cache, [1, 2, 3], 4) == (4, 5, 6, 7)


def test_equally_long_branches_go_to_the_most_recently_used() -> None:
    cache = cache_with([1, 2, 4, 5], [1, 2, 7, 8])
    assert cached_continuation(cache, [1, 2], 2) == (7, 8)
    cache.match_prefix([1, 2, 4])  # touches the 4 5 branch
    assert cached_continuation(cache, [1, 2], 2) == (4, 5)
    # A longer branch still beats a more recent one.
    assert cached_continuation(cache, [1, 2], 4) == (4, 5)  # both are 2 long: recency
    cache.insert([1, 2, 7, 8, 9], torch.arange(5))
    cache.match_prefix([1, 2, 4, 5])
    assert cached_continuation(cache, [1, 2], 4) == (7, 8, 9)


def test_the_walk_changes_nothing() -> None:
    cache = cache_with([1, 2, 3, 4, 5, 6])
    (child,) = cache.root.children.values()
    before = (list(child.key), child.last_access, child.lock_ref)
    assert cached_continuation(cache, [1, 2], 3) == (3, 4, 5)
    assert list(cache.root.children.values()) == [child]
    assert (child.key, child.last_access, child.lock_ref) == before
    assert (cache.evictable_size, cache.protected_size) == (6, 0)


# --- the proposer ------------------------------------------------------------------


def test_proposer_prefers_a_radix_continuation_at_least_as_long() -> None:
    cache = cache_with([1, 2, 3, 1, 2, 8, 8, 8])
    proposer = NgramProposer(NgramConfig(num_tokens=3), cache)
    index = proposer.new_index([1, 2, 3, 1, 2])
    assert proposer.propose(index) == Proposal((8, 8, 8), ProposalSource.RADIX)
    assert proposer.propose(index, num_tokens=1) == Proposal((8,), ProposalSource.RADIX)


def test_proposer_falls_back_to_the_history() -> None:
    cache = cache_with([1, 2, 3, 1, 2, 8])  # continues 1 2 3 1 2 by one token only
    proposer = NgramProposer(NgramConfig(num_tokens=3), cache)
    index = proposer.new_index([1, 2, 3, 1, 2])
    assert proposer.propose(index) == Proposal((3, 1, 2), ProposalSource.NGRAM)
    index.extend([5])
    assert proposer.propose(index) == Proposal((), ProposalSource.NONE)
    assert proposer.propose(index, num_tokens=0).num_tokens == 0


def test_proposer_without_radix_reads_history_only() -> None:
    cache = cache_with([1, 2, 3, 1, 2, 8, 8, 8])
    proposer = NgramProposer(NgramConfig(num_tokens=3, use_radix=False), cache)
    index = proposer.new_index([1, 2, 3, 1, 2])
    assert proposer.propose(index) == Proposal((3, 1, 2), ProposalSource.NGRAM)
