"""The radix cache against a naive reference, on random operation sequences.

The reference stores every cached token under the prefix that ends its page and its
position: ``{(tuple(ids[:page_end]), j): slot}`` (with pages of one token, its whole
prefix); a cached set is prefix-closed, so the longest match is the longest j with
every position before it present.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixlm.runtime.mem_cache.radix_cache import RadixCache, common_prefix_len

tokens = st.lists(st.integers(0, 3), min_size=1, max_size=12)  # small alphabet: shared prefixes
# whole pages of 2 tokens, pages sharing their first token
pages = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2)), min_size=1, max_size=6).map(
    lambda ps: [t for page in ps for t in page]
)


def _operations(ids):
    return st.one_of(
        st.tuples(st.just("insert"), ids),
        st.tuples(st.just("match_lock"), ids),
        st.tuples(st.just("unlock"), st.integers(0, 100)),
        st.tuples(st.just("evict"), st.integers(0, 20)),
    )


operation = _operations(tokens)


class Harness:
    def __init__(self, page_size: int = 1) -> None:
        self.freed: list[int] = []
        self.page = page_size
        self.cache = RadixCache(lambda slots: self.freed.extend(slots.tolist()), page_size)
        self.ref: dict[tuple[tuple[int, ...], int], int] = {}
        self.locked: list[tuple] = []  # (node, matched prefix)
        self.num_issued = 0
        self.owned_by_caller: list[int] = []  # duplicates insert handed back

    def key(self, ids: list[int], j: int) -> tuple[tuple[int, ...], int]:
        return tuple(ids[: (j // self.page + 1) * self.page]), j

    def ref_match(self, ids: list[int]) -> list[int]:
        out = []
        for j in range(len(ids)):
            slot = self.ref.get(self.key(ids, j))
            if slot is None:
                break
            out.append(slot)
        assert len(out) % self.page == 0  # whole pages are cached whole
        return out

    def insert(self, ids: list[int]) -> None:
        slots = torch.arange(self.num_issued + 1, self.num_issued + 1 + len(ids))
        self.num_issued += len(ids)
        present = self.cache.insert(ids, slots)
        assert present == len(self.ref_match(ids))
        self.owned_by_caller += slots[:present].tolist()
        for j in range(present, len(ids)):
            self.ref[self.key(ids, j)] = int(slots[j])

    def match_lock(self, ids: list[int]) -> None:
        result = self.cache.match_prefix(ids)
        expected = self.ref_match(ids)
        assert result.slots.tolist() == expected
        self.cache.lock(result.last_node)
        self.locked.append((result.last_node, tuple(ids[: len(expected)])))

    def unlock(self, k: int) -> None:
        if self.locked:
            node, _ = self.locked.pop(k % len(self.locked))
            self.cache.unlock(node)

    def evict(self, n: int) -> None:
        before = set(self.ref)
        freed_before = len(self.freed)
        got = self.cache.evict(n)
        assert got == len(self.freed) - freed_before
        assert got >= min(n, self.evictable_before)
        # Sync the reference with what survived; only unlocked tokens may be gone.
        survivors = {k: v for k, v in self.ref.items() if self._in_tree(k)}
        gone = before - set(survivors)
        assert all(not any(p[: len(k)] == k for _, p in self.locked) for k, _ in gone)
        self.ref = survivors

    def _in_tree(self, key: tuple[tuple[int, ...], int]) -> bool:
        return self.cache.match_prefix(list(key[0])).num_tokens == len(key[0])

    def check(self) -> None:
        cache = self.cache
        assert cache.evictable_size >= 0 and cache.protected_size >= 0
        assert cache.total_size == len(self.ref)
        protected = {k for k in self.ref for _, p in self.locked if p[: len(k[0])] == k[0]}
        assert cache.protected_size == len(protected)
        # Slots are conserved: in the tree, freed by eviction, or handed back by insert.
        everything = sorted(list(self.ref.values()) + self.freed + self.owned_by_caller)
        assert everything == list(range(1, self.num_issued + 1))
        # Locked prefixes are still fully cached.
        for _, prefix in self.locked:
            assert self.cache.match_len(list(prefix)) == len(prefix)

    def run(self, op: str, arg) -> None:
        self.evictable_before = self.cache.evictable_size
        getattr(self, op)(arg)
        self.check()


@settings(max_examples=300, deadline=None)
@given(st.lists(operation, max_size=40))
def test_random_operations_keep_every_invariant(ops):
    harness = Harness()
    for op, arg in ops:
        harness.run(op, arg)
    while harness.locked:
        harness.unlock(0)
    harness.cache.evict(10**9)
    assert harness.cache.total_size == 0 and harness.cache.protected_size == 0


@settings(max_examples=300, deadline=None)
@given(st.lists(_operations(pages), max_size=40))
def test_random_operations_on_pages_keep_every_invariant(ops):
    """Pages of 2 whose first tokens collide: a match ends on a page boundary, and an
    edge is split only there."""
    harness = Harness(page_size=2)
    for op, arg in ops:
        harness.run(op, arg)
    while harness.locked:
        harness.unlock(0)
    harness.cache.evict(10**9)
    assert harness.cache.total_size == 0 and harness.cache.protected_size == 0


def test_pages_cache_whole_pages_and_free_the_rest():
    freed: list[int] = []
    cache = RadixCache(lambda slots: freed.extend(slots.tolist()), page_size=4)
    a = list(range(10))  # two whole pages and two tokens
    node = cache.match_prefix(a).last_node
    cache.lock(node)
    cache.cache_finished(a, torch.arange(100, 110), node)
    assert freed == [108, 109] and cache.total_size == 8  # the tail is not cached
    b = [0, 1, 2, 3, 4, 5, 99, 99, 7, 7]  # shares a page and a half
    match = cache.match_prefix(b)
    assert match.slots.tolist() == [100, 101, 102, 103]  # the whole page only
    cache.lock(match.last_node)
    kept = cache.cache_unfinished(
        b, torch.cat((match.slots, torch.arange(204, 210))), match.last_node
    )
    assert kept.num_tokens == 8 and kept.slots.tolist() == [100, 101, 102, 103, 204, 205, 206, 207]
    assert freed == [108, 109]  # b's own tail (208, 209) stays the request's
    assert cache.match_len(a) == 8 and cache.match_len(b) == 8
    with pytest.raises(ValueError, match="whole pages"):
        cache.insert([1, 2, 3], torch.arange(3))


def test_partial_match_splits_the_node_and_lru_evicts_the_older_leaf():
    freed = []
    cache = RadixCache(lambda slots: freed.extend(slots.tolist()))
    cache.insert([1, 2, 3, 4], torch.tensor([10, 11, 12, 13]))
    cache.insert([1, 2, 7], torch.tensor([20, 21, 22]))  # shares [1, 2]: only 22 is new
    match = cache.match_prefix([1, 2, 3, 9])
    assert match.slots.tolist() == [10, 11, 12] and match.last_node.key == [3]
    cache.match_prefix([1, 2, 7])  # touch the [7] branch: [3]/[4] is now the LRU leaf
    assert cache.evict(1) == 1 and freed == [13]
    cache.lock(cache.match_prefix([1, 2, 7]).last_node)
    assert cache.evict(100) == 1 and freed == [13, 12]  # the locked path survives
    assert cache.match_prefix([1, 2, 7]).num_tokens == 3


def test_reset_refuses_while_locked_then_frees_everything():
    freed = []
    cache = RadixCache(lambda slots: freed.extend(slots.tolist()))
    cache.insert([5, 6], torch.tensor([1, 2]))
    node = cache.match_prefix([5, 6]).last_node
    cache.lock(node)
    try:
        cache.reset()
    except RuntimeError as e:
        assert "requests use it" in str(e)
    else:
        raise AssertionError("reset while locked was allowed")
    cache.unlock(node)
    cache.reset()
    assert sorted(freed) == [1, 2] and cache.total_size == 0


def _reference_common_prefix_len(key, ids, start=0) -> int:
    n = 0
    while n < len(key) and start + n < len(ids) and key[n] == ids[start + n]:
        n += 1
    return n


@settings(max_examples=300, deadline=None)
@given(
    length=st.integers(0, 300),
    mismatch=st.integers(0, 310),
    start=st.integers(0, 40),
    extra=st.integers(-20, 20),
    as_tuple=st.booleans(),
)
def test_common_prefix_len_finds_the_first_mismatch_in_any_chunk(
    length, mismatch, start, extra, as_tuple
):
    """Long keys (several compare chunks), a mismatch anywhere (or none), ids offset
    by ``start`` and longer or shorter than the key, lists against tuples."""
    key = list(range(10_000, 10_000 + length))
    tail = key + list(range(20_000, 20_000 + max(extra, 0)))
    if extra < 0:
        tail = tail[: max(len(tail) + extra, 0)]
    if mismatch < len(tail):
        tail[mismatch] = -1
    ids = [7] * start + tail
    other = tuple(ids) if as_tuple else ids
    expected = _reference_common_prefix_len(key, ids, start)
    assert common_prefix_len(key, other, start) == expected
    assert common_prefix_len(tuple(key), ids, start) == expected


def test_common_prefix_len_of_edge_cases():
    assert common_prefix_len([], [1, 2]) == 0
    assert common_prefix_len([1, 2], []) == 0
    assert common_prefix_len([1, 2], [1, 2], start=2) == 0
    assert common_prefix_len([5], [1, 5], start=1) == 1
    assert common_prefix_len(list(range(64)), list(range(63)) + [0]) == 63
    assert common_prefix_len(list(range(129)), list(range(128)) + [0]) == 128
