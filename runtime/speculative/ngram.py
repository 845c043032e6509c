"""Proposals without a second model: prompt lookup (n-grams) and the radix tree.

Prompt lookup decoding: the request's own history (prompt + output so far) is
searched for the most recent *earlier* occurrence of its last n tokens, n from
``max_ngram`` down to ``min_ngram``; the tokens that followed it are proposed::

    history  ... A  B  C  x  y  z ... A  B  C
                 └─ match ┘ └ copy ┘  └ suffix (n = 3)
    proposal                          x  y  z  (at most K tokens)

The copy works like an LZ77 back-reference: where it reaches the end of the
history it goes on copying the tokens it has just proposed, so a periodic tail
(``... a b a b``) proposes its period repeated (``a b a b``) instead of stopping.

The radix tree adds what other requests generated from the very same context:
if the request's whole token sequence is a cached path, the cached tokens that
continue it are a proposal (the longest such path, up to K tokens; ties go to the
most recently used branch). The walk only reads the tree: it neither splits a
node nor refreshes access times nor locks anything, so the proposals are plain
token ids and the tree may change freely between steps.

Cost, with T tokens of history, N = max_ngram - min_ngram + 1 and K proposals:

- ``NgramIndex.extend``: O(N * max_ngram) per appended token (one dict update per
  n; a key is a tuple of n ids), so O(T * N * max_ngram) over a whole request, never
  a rescan; memory O(T * N). ``truncate`` costs the same per removed token.
- ``NgramIndex.lookup``: O(N * max_ngram + K).
- ``cached_continuation``: O(T) comparisons of edge keys against the sequence
  (list slices compared in C, one per edge on the path) plus O(nodes within K
  tokens below the match); nothing is kept between calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

import torch

from radixlm.runtime.mem_cache.radix_cache import PrefixCache, TreeNode

__all__ = [
    "NgramConfig",
    "NgramIndex",
    "NgramProposer",
    "Proposal",
    "ProposalSource",
    "cached_continuation",
]


@dataclass(frozen=True)
class NgramConfig:
    """How the n-gram proposer searches.

    Attributes:
        num_tokens: K, the most tokens proposed per step.
        max_ngram: the longest suffix looked up (tried first).
        min_ngram: the shortest suffix looked up (tried last).
        use_radix: also propose the radix tree's cached continuations.
    """

    num_tokens: int = 4
    max_ngram: int = 3
    min_ngram: int = 1
    use_radix: bool = True

    def __post_init__(self) -> None:
        if self.num_tokens < 1:
            raise ValueError(f"num_tokens must be >= 1, got {self.num_tokens}")
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(
                f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}"
            )


class ProposalSource(Enum):
    NONE = "none"
    NGRAM = "ngram"
    RADIX = "radix"
    GRAMMAR = "grammar"  # text the request's grammar forces, tokenized
    DRAFT = "draft"


@dataclass(frozen=True)
class Proposal:
    """Tokens proposed to follow a request's history, and where they came from;
    a draft model's also with the (K, V) distributions they were drawn from."""

    token_ids: tuple[int, ...]
    source: ProposalSource
    draft_probs: torch.Tensor | None = field(default=None, compare=False)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


_NO_PROPOSAL = Proposal((), ProposalSource.NONE)


class NgramIndex:
    """One request's history, indexed by n-gram for prompt lookup.

    For each n in [min_ngram, max_ngram], ``_starts[n][gram]`` is a stack of the
    positions where a token followed an occurrence of ``gram``, most recent on
    top. An n-gram is indexed only once the token after it arrives, so the
    history's own suffix is never found as its own match::

        tokens   a  b  c  a  b          (positions 0..4)
        n = 2    (a,b) -> [2]           (a,b) at 3..4 has no follower yet
                 (b,c) -> [3]  (c,a) -> [4]

    Appending and truncating keep the stacks exact, so a request whose last
    output token is dropped (jump-forward re-tokenising it) stays indexed.
    """

    def __init__(self, min_ngram: int, max_ngram: int, token_ids: Sequence[int] = ()) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram
        self.token_ids: list[int] = []
        self._starts: dict[int, dict[tuple[int, ...], list[int]]] = {
            n: {} for n in range(min_ngram, max_ngram + 1)
        }
        self.extend(token_ids)

    def __len__(self) -> int:
        return len(self.token_ids)

    def extend(self, token_ids: Sequence[int]) -> None:
        """Appends tokens to the history (the request's new output ids)."""
        for token in token_ids:
            self._index_grams_before(len(self.token_ids))
            self.token_ids.append(int(token))

    def truncate(self, num_tokens: int) -> None:
        """Keeps only the first ``num_tokens`` tokens of the history.

        Raises:
            ValueError: ``num_tokens`` is negative or longer than the history.
        """
        if not 0 <= num_tokens <= len(self.token_ids):
            raise ValueError(f"cannot truncate {len(self.token_ids)} tokens to {num_tokens}")
        while len(self.token_ids) > num_tokens:
            self.token_ids.pop()
            self._unindex_grams_before(len(self.token_ids))

    def lookup(self, num_tokens: int) -> tuple[int, ...]:
        """Up to ``num_tokens`` tokens copied after the most recent earlier occurrence
        of the longest suffix (max_ngram down to min_ngram) that occurred before;
        () when none did."""
        if num_tokens <= 0:
            return ()
        tokens = self.token_ids
        for n in range(min(self.max_ngram, len(tokens)), self.min_ngram - 1, -1):
            starts = self._starts[n].get(tuple(tokens[-n:]))
            if starts:
                return self._copy(starts[-1], num_tokens)
        return ()

    def _copy(self, start: int, num_tokens: int) -> tuple[int, ...]:
        """tokens[start:] continued by the copy itself (an overlapping back-reference)."""
        out = self.token_ids[start : start + num_tokens]
        distance = len(self.token_ids) - start
        while len(out) < num_tokens:
            out.append(out[len(out) - distance])
        return tuple(out)

    def _index_grams_before(self, position: int) -> None:
        """Records ``position`` as the follower of every indexed n-gram ending just before it."""
        for n, starts in self._starts.items():
            if position >= n:
                starts.setdefault(tuple(self.token_ids[position - n : position]), []).append(
                    position
                )

    def _unindex_grams_before(self, position: int) -> None:
        """Undoes ``_index_grams_before(position)``; ``position`` is on top of each stack."""
        for n, starts in self._starts.items():
            if position >= n:
                gram = tuple(self.token_ids[position - n : position])
                stack = starts[gram]
                assert stack[-1] == position
                stack.pop()
                if not stack:
                    del starts[gram]


class NgramProposer:
    """Proposes up to K tokens per request from its history and the radix tree.

    Args:
        config: search settings.
        cache: the prefix cache to read continuations from (None, or a cache that
            does not share prefixes: history only).

    The radix tree's continuation is taken when it is at least as long as the
    n-gram proposal: it is what a model already generated from this exact context,
    while an n-gram match agrees with it on a few tokens only.
    """

    def __init__(self, config: NgramConfig, cache: PrefixCache | None = None) -> None:
        self.config = config
        self._cache = cache if config.use_radix else None

    def new_index(self, token_ids: Sequence[int] = ()) -> NgramIndex:
        """An index for one request, holding ``token_ids`` (its prompt, usually)."""
        return NgramIndex(self.config.min_ngram, self.config.max_ngram, token_ids)

    def propose(
        self, index: NgramIndex, num_tokens: int | None = None, after: Sequence[int] = ()
    ) -> Proposal:
        """Up to ``num_tokens`` (default: ``config.num_tokens``) tokens to follow the
        history in ``index`` (and then ``after``, tokens proposed before these: the
        history is looked up as if they had been appended); an empty proposal when
        nothing matches."""
        k = self.config.num_tokens if num_tokens is None else num_tokens
        if k <= 0:
            return _NO_PROPOSAL
        if after:
            index.extend(after)
            try:
                return self.propose(index, k)
            finally:
                index.truncate(len(index) - len(after))
        ngram = index.lookup(k)
        radix: tuple[int, ...] = ()
        if self._cache is not None and self._cache.shares_prefixes:
            radix = cached_continuation(self._cache, index.token_ids, k)
        if radix and len(radix) >= len(ngram):
            return Proposal(radix, ProposalSource.RADIX)
        if ngram:
            return Proposal(ngram, ProposalSource.NGRAM)
        return _NO_PROPOSAL


def cached_continuation(
    cache: PrefixCache, token_ids: Sequence[int], num_tokens: int
) -> tuple[int, ...]:
    """Up to ``num_tokens`` cached tokens continuing ``token_ids`` in the radix tree.

    Only when all of ``token_ids`` is a cached path: its continuation is the rest of
    the edge it ends in, then the longest path below (capped at ``num_tokens``, ties
    to the most recently used child). Reads the tree only; () when there is none.
    """
    ids = list(token_ids)
    if not ids or num_tokens <= 0:
        return ()
    node, i = cache.root, 0
    while i < len(ids):
        child = node.children.get(ids[i])
        if child is None:
            return ()
        n = min(len(child.key), len(ids) - i)
        if child.key[:n] != ids[i : i + n]:
            return ()
        if n < len(child.key):  # the sequence ends inside this edge
            tail = child.key[n : n + num_tokens]
            return tuple(tail + _longest_path(child, num_tokens - len(tail)))
        node, i = child, i + n
    return tuple(_longest_path(node, num_tokens))


def _longest_path(node: TreeNode, budget: int) -> list[int]:
    """The longest token path below ``node``, capped at ``budget`` tokens; among equally
    long ones, the one through the most recently used children."""
    best: list[int] = []
    if budget <= 0:
        return best
    for child in sorted(node.children.values(), key=lambda c: c.last_access, reverse=True):
        path = child.key[:budget]
        if len(path) < budget:
            path = path + _longest_path(child, budget - len(path))
        if len(path) > len(best):
            best = path
            if len(best) == budget:
                break
    return best
