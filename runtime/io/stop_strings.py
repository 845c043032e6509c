"""A request's stop strings as one Aho-Corasick automaton.

Matching costs O(1) amortised per output character, whatever the number and the
length of the stop strings, and the automaton takes memory linear in their total
length; it is immutable, so a request's samples share one. Each detokenizer keeps
only its state, a node of the trie::

    stops "abd", "bc"          root -a-> 1 -b-> 2 -d-> 3 (ends "abd")
                               root -b-> 4 -c-> 5 (ends "bc")
    fail links: 2 -> 4 ("ab" ends in "b"), others -> root

    state after some text = the node of the longest suffix of the text that is a
    prefix of a stop string; its depth is how much text must be held back (it may
    still become a stop string). A node on whose failure chain a stop string ends
    is a match.

Which stop wins: the match that ends first (generation stops as soon as any stop
string is complete, however the text was split into chunks); among those ending
at the same character the longest (it began first); equal strings: the first listed.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["StopMatch", "StopStrings"]

ROOT = 0
_CHAR_BITS = 21  # every code point is below 2**21: an edge's key is node << 21 | code point


@dataclass(frozen=True)
class StopMatch:
    """Where ``scan`` found a stop string: ``end`` is the index just past it in the
    scanned text; ``stop`` the string."""

    end: int
    stop: str


class StopStrings:
    """The automaton of ``stops`` (non-empty strings); ``scan`` advances a state."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stops)
        # The trie's edges in one flat dict (about 100 bytes a character, a third of a
        # dict per node); per node, in arrays: depth, failure link, match.
        self._edges: dict[int, int] = {}
        self._depth = array("i", [0])
        own_end = array("i", [-1])  # the stop string ending exactly at a node
        for i, stop in enumerate(self.stops):
            node = self._insert(stop, own_end)
            if own_end[node] < 0:
                own_end[node] = i
        self._fail, self._match = self._link(own_end)
        self._chars = frozenset("".join(self.stops))

    def __bool__(self) -> bool:
        return bool(self.stops)

    def held(self, state: int) -> int:
        """How many characters of text ending in ``state`` could still begin a stop."""
        return self._depth[state]

    def scan(self, state: int, text: str) -> tuple[int, StopMatch | None]:
        """Advance ``state`` over ``text``: the new state, and the first stop string
        completed in it (then the state is of no further use)."""
        if state == ROOT and self._chars.isdisjoint(text):
            return ROOT, None  # the common case: nothing of any stop string in sight
        edges, fail, match = self._edges, self._fail, self._match
        for i, char in enumerate(text):
            code = ord(char)
            while (state << _CHAR_BITS | code) not in edges and state != ROOT:
                state = fail[state]
            state = edges.get(state << _CHAR_BITS | code, ROOT)
            if match[state] >= 0:
                return state, StopMatch(i + 1, self.stops[match[state]])
        return state, None

    def _insert(self, stop: str, own_end: array) -> int:
        node = ROOT
        for char in stop:
            key = node << _CHAR_BITS | ord(char)
            child = self._edges.get(key)
            if child is None:
                child = len(self._depth)
                self._edges[key] = child
                self._depth.append(self._depth[node] + 1)
                own_end.append(-1)
            node = child
        return node

    def _link(self, own_end: array) -> tuple[array, array]:
        """Failure links and, per node, the longest stop ending there (-1: none), node
        by node in order of depth: a failure target is shallower, so already linked."""
        edges, depth = self._edges, self._depth
        fail = array("i", bytes(4 * len(depth)))
        match = array("i", own_end)
        mask = (1 << _CHAR_BITS) - 1
        for key, child in sorted(edges.items(), key=lambda edge: depth[edge[1]]):
            parent, code = key >> _CHAR_BITS, key & mask
            if parent != ROOT:
                target = fail[parent]
                while (target << _CHAR_BITS | code) not in edges and target != ROOT:
                    target = fail[target]
                fail[child] = edges.get(target << _CHAR_BITS | code, ROOT)
            if match[child] < 0:
                match[child] = match[fail[child]]
        return fail, match
