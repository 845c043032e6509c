"""A radix tree over token ids whose values are KV slot indices (RadixAttention).

Each edge holds a run of tokens and the slots holding their K/V; a path from
the root spells a cached token prefix::

    root
     └─ [The, cap, ital]           slots [11, 12, 13]
         ├─ [of, France]           slots [14, 15]
         └─ [city, of, Peru]       slots [40, 41, 42]

Ownership: slots stored in the tree belong to the tree until it evicts them
(it then hands them to ``free_slots``, the slot allocator's ``free``). A running
request *locks* the node ending its matched prefix; a locked node and all its
ancestors are never evicted. Which methods mutate: ``match_prefix`` (splits a
node on a partial match, refreshes access times), ``insert``, ``lock``,
``unlock``, ``evict``, ``reset``. Plain data structures, no model code.

Invariant: ``evictable_size + protected_size == total_size`` (tokens in the tree),
where protected tokens are those on a path to a locked node.

Pages: with ``page_size`` P > 1 the tree holds whole pages of P tokens only (a KIVI
pool's key groups, whose parameters live in their own P slots): every edge is a
whole number of pages, a child is keyed by its first page, a match ends on a page
boundary, and a finished request's tokens past its last whole page are freed, not
cached.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

__all__ = [
    "DisabledCache",
    "MatchResult",
    "PrefixCache",
    "RadixCache",
    "TreeNode",
    "common_prefix_len",
]

_EMPTY = torch.empty(0, dtype=torch.int64)

ChildKey = int | tuple[int, ...]
"""A child's key in its parent: its first token, or its first page's (page size > 1)."""


@dataclass(eq=False)
class TreeNode:
    key: list[int] = field(default_factory=list)  # tokens on the edge into this node
    value: torch.Tensor = field(default_factory=lambda: _EMPTY)  # (len(key),) slots
    parent: TreeNode | None = None
    children: dict[ChildKey, TreeNode] = field(default_factory=dict)  # first page -> child
    lock_ref: int = 0
    last_access: int = 0

    def __lt__(self, other: TreeNode) -> bool:  # heap order for LRU eviction
        return self.last_access < other.last_access


@dataclass(frozen=True)
class MatchResult:
    """slots: (num_tokens,) KV slots of the longest cached prefix.
    last_node: the node that prefix ends at (lock it while using the slots)."""

    slots: torch.Tensor
    last_node: TreeNode

    @property
    def num_tokens(self) -> int:
        return int(self.slots.numel())


class RadixCache:
    """Prefix cache keyed by token ids. ``free_slots`` receives evicted slots."""

    shares_prefixes = True

    def __init__(self, free_slots: Callable[[torch.Tensor], None], page_size: int = 1) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be at least 1, got {page_size}")
        self.page_size = page_size
        self._free_slots = free_slots
        self._clock = itertools.count(1)
        self.reset_stats()
        self._new_root()

    def _new_root(self) -> None:
        self.root = TreeNode(lock_ref=1)  # the root is never evicted
        self.evictable_size = 0
        self.protected_size = 0

    def reset_stats(self) -> None:
        self.num_evicted_tokens = 0

    @property
    def total_size(self) -> int:
        return self.evictable_size + self.protected_size

    # ---- lookup and insertion ---------------------------------------------------------

    def match_prefix(self, ids: Sequence[int]) -> MatchResult:
        """Longest cached prefix of ``ids``. Splits a node that matches only partly,
        so ``last_node`` ends exactly at the match (on a page boundary)."""
        ids = self._whole_pages(ids)
        node, parts, i = self.root, [], 0
        while i < len(ids) and (child := node.children.get(self._child_key(ids, i))) is not None:
            n = self._common_len(child.key, ids, i)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = next(self._clock)
            parts.append(child.value)
            node, i = child, i + n
        slots = torch.cat(parts) if parts else _EMPTY
        return MatchResult(slots, node)

    def match_len(self, ids: Sequence[int]) -> int:
        """Length of the longest cached prefix of ``ids``; changes nothing."""
        ids = self._whole_pages(ids)
        node, i = self.root, 0
        while i < len(ids) and (child := node.children.get(self._child_key(ids, i))) is not None:
            n = self._common_len(child.key, ids, i)
            i += n
            if n < len(child.key):
                break
            node = child
        return i

    def insert(self, ids: Sequence[int], slots: torch.Tensor) -> int:
        """Caches ``ids`` -> ``slots``. Returns how many leading tokens were cached
        already: the caller keeps owning ``slots[:that]`` (duplicates it must free
        unless they are the tree's own); the tree now owns the rest. ``ids``: whole
        pages."""
        if len(ids) != slots.numel():
            raise ValueError(f"insert: {len(ids)} ids but {slots.numel()} slots")
        if len(ids) % self.page_size:
            raise ValueError(f"insert: {len(ids)} ids is not whole pages of {self.page_size}")
        node, i = self.root, 0
        while i < len(ids) and (child := node.children.get(self._child_key(ids, i))) is not None:
            n = self._common_len(child.key, ids, i)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = next(self._clock)
            node, i = child, i + n
        if i < len(ids):
            leaf = TreeNode(list(ids[i:]), slots[i:].clone(), node, {}, 0, next(self._clock))
            node.children[self._child_key(ids, i)] = leaf
            self.evictable_size += len(leaf.key)  # a new leaf is unlocked
        return i

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cuts ``child``'s edge after n tokens; returns the new upper node."""
        assert child.parent is not None
        upper = TreeNode(
            child.key[:n],
            child.value[:n],
            child.parent,
            {self._child_key(child.key, n): child},
            child.lock_ref,
            child.last_access,
        )
        child.parent.children[self._child_key(child.key, 0)] = upper
        child.key, child.value, child.parent = child.key[n:], child.value[n:], upper
        return upper

    # ---- what the scheduler calls ------------------------------------------------------

    def cache_finished(self, ids: Sequence[int], slots: torch.Tensor, node: TreeNode) -> None:
        """A request stops using its KV (finished, aborted or retracted): cache its
        computed tokens, free slots the tree already had a copy of (and those past the
        last whole page), unlock ``node``."""
        num_locked = self.prefix_len(node)
        whole = len(self._whole_pages(ids))
        present = self.insert(ids[:whole], slots[:whole])
        self._free_slots(slots[num_locked:present])  # duplicates of another request's
        self._free_slots(slots[whole:])
        self.unlock(node)

    def cache_unfinished(
        self, ids: Sequence[int], slots: torch.Tensor, node: TreeNode
    ) -> MatchResult:
        """A request keeps running (e.g. after a prefill chunk): cache what it computed so
        others can share it now. Returns its new locked prefix: the slots it must use
        from now on (the tree's copy where it had one) and the node to unlock later:
        its whole pages; the request keeps its own slots past them."""
        num_locked = self.prefix_len(node)
        whole = len(self._whole_pages(ids))
        present = self.insert(ids[:whole], slots[:whole])
        self._free_slots(slots[num_locked:present])
        match = self.match_prefix(ids[:whole])
        self.lock(match.last_node)
        self.unlock(node)
        return match

    def prefix_len(self, node: TreeNode) -> int:
        """Tokens on the path root -> node (the tree-owned prefix a request locked)."""
        n = 0
        while node is not self.root:
            n += len(node.key)
            assert node.parent is not None
            node = node.parent
        return n

    # ---- locking ------------------------------------------------------------------------

    def lock(self, node: TreeNode) -> None:
        """Protects the path root -> node from eviction (reference counted)."""
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.key)
                self.protected_size += len(node.key)
            node.lock_ref += 1
            assert node.parent is not None
            node = node.parent

    def unlock(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref <= 0:
                raise RuntimeError("unlock of a node that is not locked")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.protected_size -= len(node.key)
                self.evictable_size += len(node.key)
            assert node.parent is not None
            node = node.parent

    # ---- eviction -----------------------------------------------------------------------

    def evict(self, num_tokens: int) -> int:
        """Frees at least ``num_tokens`` slots from unlocked leaves, least recently
        used first, or all evictable ones. Returns how many it freed."""
        leaves = [n for n in self._nodes() if not n.children and n.lock_ref == 0]
        heapq.heapify(leaves)
        freed = 0
        while freed < num_tokens and leaves:
            leaf = heapq.heappop(leaves)
            parent = leaf.parent
            assert parent is not None
            self._free_slots(leaf.value)
            del parent.children[self._child_key(leaf.key, 0)]
            self.evictable_size -= len(leaf.key)
            freed += len(leaf.key)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(leaves, parent)
        self.num_evicted_tokens += freed
        return freed

    def reset(self) -> None:
        """Empties the tree, freeing every slot. Refused while any node is locked."""
        if self.protected_size:
            raise RuntimeError("cannot flush the radix cache while requests use it")
        for node in self._nodes():
            self._free_slots(node.value)
        self._new_root()

    # ---- helpers ------------------------------------------------------------------------

    def _whole_pages(self, ids: Sequence[int]) -> Sequence[int]:
        """``ids`` cut to whole pages."""
        return ids if self.page_size == 1 else ids[: len(ids) // self.page_size * self.page_size]

    def _child_key(self, ids: Sequence[int], i: int) -> ChildKey:
        """The key of a child whose edge starts at ``ids[i]``."""
        return ids[i] if self.page_size == 1 else tuple(ids[i : i + self.page_size])

    def _common_len(self, key: Sequence[int], ids: Sequence[int], start: int) -> int:
        """``common_prefix_len`` cut to whole pages."""
        n = common_prefix_len(key, ids, start)
        return n - n % self.page_size

    def _nodes(self) -> list[TreeNode]:
        """Every node but the root."""
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out


# common_prefix_len looks for a mismatch this many tokens at a time
_COMPARE_CHUNK = 64


def common_prefix_len(key: Sequence[int], ids: Sequence[int], start: int = 0) -> int:
    """How many leading tokens of ``key`` equal ``ids[start:]``'s.

    Compares list slices (in C) rather than token by token in Python: a whole edge
    that matches costs one comparison, a mismatch one per ``_COMPARE_CHUNK`` tokens
    before it plus at most ``_COMPARE_CHUNK`` single-token steps.
    """
    n = min(len(key), len(ids) - start)
    if n <= 0:
        return 0
    a, b = _as_list(key[:n]), _as_list(ids[start : start + n])
    if a == b:
        return n
    lo = 0
    while a[lo : lo + _COMPARE_CHUNK] == b[lo : lo + _COMPARE_CHUNK]:
        lo += _COMPARE_CHUNK
    return next(j for j in range(lo, lo + _COMPARE_CHUNK) if a[j] != b[j])


def _as_list(ids: Sequence[int]) -> list[int]:
    """A list (slices of lists compare elementwise; a list never equals a tuple)."""
    return ids if isinstance(ids, list) else list(ids)


class PrefixCache(Protocol):
    """What the scheduler needs from a prefix cache (``RadixCache`` or ``DisabledCache``)."""

    root: TreeNode
    evictable_size: int
    protected_size: int
    num_evicted_tokens: int

    @property
    def total_size(self) -> int: ...

    shares_prefixes: bool

    def match_prefix(self, ids: Sequence[int]) -> MatchResult: ...
    def match_len(self, ids: Sequence[int]) -> int: ...
    def lock(self, node: TreeNode) -> None: ...
    def prefix_len(self, node: TreeNode) -> int: ...
    def cache_finished(self, ids: Sequence[int], slots: torch.Tensor, node: TreeNode) -> None: ...
    def cache_unfinished(
        self, ids: Sequence[int], slots: torch.Tensor, node: TreeNode
    ) -> MatchResult: ...
    def evict(self, num_tokens: int) -> int: ...
    def reset(self) -> None: ...


class DisabledCache:
    """The no-sharing baseline behind the same interface: nothing is ever cached, so
    every match is empty and a finished request's slots are freed at once."""

    shares_prefixes = False

    def __init__(self, free_slots: Callable[[torch.Tensor], None], page_size: int = 1) -> None:
        """page_size: as ``RadixCache``'s (nothing is cached, so it changes nothing)."""
        self._free_slots = free_slots
        self.root = TreeNode(lock_ref=1)
        self.evictable_size = self.protected_size = self.num_evicted_tokens = 0

    def match_prefix(self, ids: Sequence[int]) -> MatchResult:
        return MatchResult(_EMPTY, self.root)

    def match_len(self, ids: Sequence[int]) -> int:
        return 0

    def lock(self, node: TreeNode) -> None:
        pass

    def prefix_len(self, node: TreeNode) -> int:
        return 0

    @property
    def total_size(self) -> int:
        return 0

    def cache_finished(self, ids: Sequence[int], slots: torch.Tensor, node: TreeNode) -> None:
        self._free_slots(slots)

    def cache_unfinished(
        self, ids: Sequence[int], slots: torch.Tensor, node: TreeNode
    ) -> MatchResult:
        return MatchResult(slots, self.root)

    def evict(self, num_tokens: int) -> int:
        return 0

    def reset(self) -> None:
        pass
