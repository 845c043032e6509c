"""What JSON Schema ``pattern``s say, beyond what a backend's regex engine reads.

``portable_pattern`` writes a pattern in syntax llguidance reads, taking the same
strings: ``\\<`` and ``\\>`` (ECMA-262's identity escapes: ``<`` and ``>``; llguidance
reads word boundaries), and an end anchor inside a repeated group, ``^(B($|Y))+$``
(each segment ends with ``Y`` or the string: a path of ``/``-separated names), as
``^(?:(?:BY)*B(?:Y)?)$``, which llguidance refuses as a lookaround.

``assertion_inside`` names what a regex engine that ignores assertions it cannot place
would drop: a lookaround, or an anchor that does not start or end a top-level
alternative (xgrammar reads ``^(a|b$)c`` as taking ``"bc"``).

``patterns_apart`` tells whether two patterns can match the same string, from the
product of their automata, for ``schema_facts``' oneOf proofs: ``^u?int(8|16|...)?$`` and
``^u?fixed(0x8|8x0|...)$`` share no string, which neither their first characters nor
their alphabets show.

A pattern is searched, not matched whole (ECMA-262 and the validator's ``re.search``),
so each is read as the strings it matches somewhere: any text on each side that ``^`` /
``$`` do not anchor, and a final ``$`` as an optional last newline (Python's ``$`` also
matches before one). interegular parses it; the automaton is a Thompson NFA of ours
over that parse (not interegular's DFA, whose construction is exponential in the worst
case: ``(a|b)*a(a|b){12}`` takes it 30 s), and two patterns share a string where the
product of their NFAs reaches both final states: a search over pairs of states,
polynomial and bounded (``_MAX_PAIRS``).

A proof is sound only where each automaton takes at least every string the validator's
pattern matches, so nothing is proven (False) for a pattern that could read otherwise
or cost too much:

    escapes other than of punctuation, ``\\n \\t \\r \\f \\v`` and the classes ``\\d \\w \\s``
        (and negations, read as supersets of Python's Unicode classes): ``\\b``, ``\\p``,
        ``\\A``, ``\\x``, ``\\u``, backreferences
    a class starting with ``]`` (``[]`` and ``[^]`` read otherwise in ECMA-262)
    a ``^`` or ``$`` other than the first and last character (``^a$|^b$``)
    a group that is not plain or ``(?:...)``: flags (``(?i)``), lookarounds, named
        and atomic groups
    what interegular does not parse (backreferences)
    over ``_MAX_PATTERN_CHARS`` characters or ``_MAX_STATES`` NFA states (counted
        repeats), or a product search past ``_MAX_PAIRS`` pairs of states
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["assertion_inside", "patterns_apart", "portable_pattern"]

_MAX_PATTERN_CHARS = 4096
_MAX_STATES = 20_000  # one pattern's NFA
_MAX_PAIRS = 200_000  # pairs of states the product search visits
# The escapes read as themselves: punctuation, and these control characters.
_READ_ESCAPES = frozenset("ntrfv")
_ASCII = frozenset(map(chr, range(128)))


def _ascii_matching(escape: str) -> frozenset[str]:
    return frozenset(c for c in _ASCII if re.fullmatch(escape, c))


# Class escapes: Python's re (the validator) reads \d \w \s and their negations as
# Unicode classes, interegular as ASCII ones. Each is written as a placeholder character
# before interegular parses the pattern, and read as a superset of Python's class: every
# character but the ASCII ones the class refuses (in a negated class, every character
# but the ASCII ones it takes). Other letter escapes are not read: \b (by those
# classes), \p (Unicode properties), \A \Z (anchors), \x \u \0 (codes), \1
# (backreferences). escape -> (placeholder, ASCII it refuses, ASCII it takes)
_CLASS_ESCAPES: dict[str, tuple[str, frozenset[str], frozenset[str]]] = {
    escape: (chr(0xF0000 + n), _ASCII - _ascii_matching(f"\\{escape}"),
             _ascii_matching(f"\\{escape}"))
    for n, escape in enumerate("dDwWsS")
}  # fmt: skip
_PLACEHOLDERS = {place: (refused, taken) for place, refused, taken in _CLASS_ESCAPES.values()}

# A set of characters: (characters, negated); negated, every character but those.
_Chars = tuple[frozenset[str], bool]
_ANY: _Chars = (frozenset(), True)
_NOT_NEWLINE: _Chars = (frozenset("\n"), True)  # Python's "." (no DOTALL)
_NEWLINE: _Chars = (frozenset("\n"), False)
_EMPTY_CLASS = "[]"  # a token: a class opening on ] (see _tokens)


class _Unread(Exception):
    """The pattern is not read here (syntax it lacks, or past a bound)."""


def patterns_apart(a: Any, b: Any) -> bool:
    """Whether no string matches both patterns ``a`` and ``b`` (False where not proven)."""
    if not (isinstance(a, str) and isinstance(b, str)):
        return False
    first, second = _automaton(a), _automaton(b)
    if first is None or second is None:
        return False
    return _meet(first, second) is False


@dataclass
class _Nfa:
    """A Thompson NFA: state ``s`` moves to each of ``empty[s]`` reading nothing, and
    for each ``(chars, t)`` of ``steps[s]`` to ``t`` reading a character of ``chars``."""

    empty: list[list[int]] = field(default_factory=list)
    steps: list[list[tuple[_Chars, int]]] = field(default_factory=list)
    start: int = 0
    final: int = 0

    def state(self) -> int:
        if len(self.empty) >= _MAX_STATES:
            raise _Unread(f"over {_MAX_STATES} states")
        self.empty.append([])
        self.steps.append([])
        return len(self.empty) - 1

    def chars(self, chars: _Chars) -> tuple[int, int]:
        """A fragment reading one character of ``chars``: its (entry, exit)."""
        entry, exit_ = self.state(), self.state()
        self.steps[entry].append((chars, exit_))
        return entry, exit_

    def star(self, fragment: tuple[int, int]) -> tuple[int, int]:
        """``fragment`` repeated any number of times (none included)."""
        hub = self.state()
        self.empty[hub].append(fragment[0])
        self.empty[fragment[1]].append(hub)
        return hub, hub

    def chain(self, fragments: list[tuple[int, int]]) -> tuple[int, int]:
        if not fragments:
            state = self.state()
            return state, state
        for (_, exit_), (entry, _) in zip(fragments, fragments[1:]):
            self.empty[exit_].append(entry)
        return fragments[0][0], fragments[-1][1]

    def optional(self, fragment: tuple[int, int]) -> tuple[int, int]:
        self.empty[fragment[0]].append(fragment[1])
        return fragment


@functools.lru_cache(maxsize=256)
def _automaton(pattern: str) -> _Nfa | None:
    """The NFA of the strings ``pattern`` matches somewhere; None where not read."""
    rewritten = _rewritten(pattern) if len(pattern) <= _MAX_PATTERN_CHARS else None
    if rewritten is None:
        return None
    start = rewritten.startswith("^")
    end = rewritten.endswith("$") and not _escaped(rewritten, len(rewritten) - 1)
    body = rewritten[1 if start else 0 : len(rewritten) - 1 if end else len(rewritten)]
    nfa = _Nfa()
    try:
        import interegular  # lazy: an optional package (outlines' parser); else unproven
    except ImportError:
        return None
    try:
        parsed = interegular.parse_pattern(body)
    except Exception:  # interegular raises many types for syntax it lacks
        return None
    try:
        parts = [_fragment(nfa, parsed)]
        parts.insert(0, nfa.star(nfa.chars(_ANY)) if not start else nfa.chain([]))
        parts.append(nfa.optional(nfa.chars(_NEWLINE)) if end else nfa.star(nfa.chars(_ANY)))
    except _Unread:
        return None
    nfa.start, nfa.final = nfa.chain(parts)
    return nfa


def _fragment(nfa: _Nfa, node: Any) -> tuple[int, int]:
    """The fragment of interegular's parse ``node``: its (entry, exit).

    Raises:
        _Unread: a node of a kind not read here (a lookaround, flags), or too many states.
    """
    from interegular import patterns as ast  # lazy: optional; _automaton imported it already

    if isinstance(node, ast.Pattern):
        if node.added_flags or node.removed_flags:
            raise _Unread("flags")
        entry, exit_ = nfa.state(), nfa.state()
        for option in node.options:
            first, last = _fragment(nfa, option)
            nfa.empty[entry].append(first)
            nfa.empty[last].append(exit_)
        return entry, exit_
    if isinstance(node, ast._Concatenation):
        return nfa.chain([_fragment(nfa, part) for part in node.parts])
    if isinstance(node, ast._Repeated):
        parts = [_fragment(nfa, node.base) for _ in range(node.min)]
        if node.max is None:
            parts.append(nfa.star(_fragment(nfa, node.base)))
        else:
            parts += [nfa.optional(_fragment(nfa, node.base)) for _ in range(node.max - node.min)]
        return nfa.chain(parts)
    if isinstance(node, ast._CharGroup):
        return nfa.chars(_class_set(frozenset(node.chars), bool(node.negated)))
    if node is ast._DOT:
        return nfa.chars(_NOT_NEWLINE)
    if node is ast._EMPTY:
        return nfa.chain([])
    raise _Unread(type(node).__name__)  # a lookaround (_NonCapturing), or unknown


def _class_set(chars: frozenset[str], negated: bool) -> _Chars:
    """The set a class of ``chars`` (placeholders among them) stands for, or holds at
    least: a class escape adds every character but the ASCII ones it refuses; in a
    negated class, it removes only the ASCII ones it takes."""
    escapes = [_PLACEHOLDERS[c] for c in chars if c in _PLACEHOLDERS]
    plain = chars - _PLACEHOLDERS.keys()
    if not escapes:
        return plain, negated
    if negated:  # neither plain nor any escape's: at most what none of them takes in ASCII
        return plain.union(*(taken for _, taken in escapes)), True
    # plain or any escape's: all but what every escape refuses and plain lacks
    return frozenset.intersection(*(refused for refused, _ in escapes)) - plain, True


def _meet(a: _Nfa, b: _Nfa) -> bool | None:
    """Whether some string takes both NFAs to their final states (None: not known
    within ``_MAX_PAIRS`` pairs of states)."""
    start = (a.start, b.start)
    seen, todo = {start}, [start]
    while todo:
        p, q = todo.pop()
        if p == a.final and q == b.final:
            return True
        moves = [(p2, q) for p2 in a.empty[p]] + [(p, q2) for q2 in b.empty[q]]
        moves += [
            (p2, q2)
            for mine, p2 in a.steps[p]
            for theirs, q2 in b.steps[q]
            if _overlap(mine, theirs)
        ]
        for pair in moves:
            if pair not in seen:
                if len(seen) >= _MAX_PAIRS:
                    return None
                seen.add(pair)
                todo.append(pair)
    return False


def _overlap(a: _Chars, b: _Chars) -> bool:
    """Whether some character is in both sets (the alphabet is infinite: two negated
    sets always share one)."""
    (chars_a, negated_a), (chars_b, negated_b) = a, b
    if negated_a and negated_b:
        return True
    if negated_a:
        return bool(chars_b - chars_a)
    if negated_b:
        return bool(chars_a - chars_b)
    return bool(chars_a & chars_b)


def _rewritten(pattern: str) -> str | None:
    """``pattern`` with each class escape (``\\d`` ...) written as its placeholder
    character, or None where it is not read: an escape other than those, a ``^`` / ``$``
    but the first and last character (outside bracket classes, where they are literal
    or a negation), a group other than ``(...)`` and ``(?:...)``, a class starting with
    ``]`` (ECMA-262 and Python read ``[]`` and ``[^]`` otherwise), or a character of the
    placeholders' own."""
    if any(char in _PLACEHOLDERS for char in pattern):
        return None
    out: list[str] = []
    last = len(pattern) - 1
    for i, token, in_class in _tokens(pattern):
        if token.startswith("\\"):
            escaped = token[1:]
            if escaped in _CLASS_ESCAPES:
                token = _CLASS_ESCAPES[escaped][0]
            elif not escaped or (escaped.isalnum() and escaped not in _READ_ESCAPES):
                return None
        elif token == _EMPTY_CLASS or (not token and in_class):
            return None
        elif in_class:
            pass
        elif token == "(" and pattern[i + 1 : i + 2] == "?" and pattern[i + 2 : i + 3] != ":":
            return None  # a flag, a lookaround, a named or atomic group
        elif (token == "^" and i != 0) or (token == "$" and i != last):
            return None
        out.append(token)
    return "".join(out)


def _tokens(pattern: str) -> Iterator[tuple[int, str, bool]]:
    """``pattern``'s tokens with their index and whether they sit in a bracket class: an
    escape (a backslash and what follows), or one character; ``_EMPTY_CLASS`` for a
    class opening on ``]`` (``[]`` and ``[^]``, read otherwise in ECMA-262: nothing
    after it is read); last, ``""`` with whether a class was left open."""
    in_class, i = False, 0
    while i < len(pattern):
        token = pattern[i : i + 2] if pattern[i] == "\\" else pattern[i]
        if token == "[" and not in_class:
            if pattern[i + 1 : i + 2] == "]" or pattern[i + 1 : i + 3] == "^]":
                yield i, _EMPTY_CLASS, False
                return
            yield i, token, in_class
            in_class = True
        else:
            yield i, token, in_class
            in_class = in_class and token != "]"
        i += len(token)
    yield i, "", in_class


def _escaped(pattern: str, index: int) -> bool:
    """Whether the character at ``index`` is escaped (an odd run of backslashes before)."""
    run = len(pattern[:index]) - len(pattern[:index].rstrip("\\"))
    return run % 2 == 1


def portable_pattern(pattern: str) -> str:
    """``pattern`` in syntax llguidance reads, with the same strings (the module's
    list); unchanged where none of that applies."""
    pattern = _identity_escapes(pattern)
    match = _END_IN_GROUP.fullmatch(pattern)
    if match is None or "$" in match["body"] or not _one_sequence(match["body"]):
        return pattern
    body, then = match["body"], match["then"]
    segments = f"(?:(?:{body}{then})*{body}(?:{then})?)"
    return f"^{segments}{'' if match['repeat'] == '+' else '?'}$"


# ^(B($|Y))+$ or *: B balanced, Y a run without groups, alternation or anchors
_END_IN_GROUP = re.compile(
    r"\^\((?P<body>.+)\(\$\|(?P<then>(?:\\.|[^()|$\\])+)\)\)(?P<repeat>[+*])\$"
)


def _identity_escapes(pattern: str) -> str:
    """``\\<`` and ``\\>`` written as the characters they stand for."""
    out, i = [], 0
    while i < len(pattern):
        pair = pattern[i : i + 2]
        if pair in ("\\<", "\\>"):
            out.append(pair[1])
            i += 2
        elif pair.startswith("\\"):
            out.append(pair)
            i += 2
        else:
            out.append(pattern[i])
            i += 1
    return "".join(out)


def _one_sequence(text: str) -> bool:
    """Whether ``text`` is one sequence: its parentheses (outside classes, unescaped)
    pair up, no ``|`` splits it at its top level, and it does not open with a group's
    ``?`` (it is a group's whole body)."""
    depth = 0
    for _, token, in_class in _tokens(text):
        if token == _EMPTY_CLASS or (not token and in_class):
            return False
        if in_class:
            continue
        if token == "(":
            depth += 1
        elif token == ")":
            depth -= 1
            if depth < 0:
                return False
        elif token == "|" and depth == 0:
            return False
    return depth == 0 and not text.startswith("?")


def assertion_inside(pattern: str) -> str | None:
    """What of ``pattern`` asserts rather than matches, other than a ``^`` starting or a
    ``$`` ending a top-level alternative (group brackets aside): "a lookaround", "an
    anchor inside it", or None."""
    tokens = list(_tokens(pattern))
    if tokens[-1][1] == _EMPTY_CLASS:  # not read past it: judged by its text
        rest = pattern[tokens[-1][0] :]
        return "an anchor inside it" if re.search(r"[$^]|\(\?<?[=!]", rest) else None
    tops, depth = [-1], 0  # the top-level |s, and the pattern's edges
    for i, token, in_class in tokens:
        if in_class:
            continue
        if token == "(":
            if re.match(r"\(\?<?[=!]", pattern[i:]):
                return "a lookaround"
            depth += 1
        elif token == ")":
            depth -= 1
        elif token == "|" and depth == 0:
            tops.append(i)
    tops.append(len(pattern))
    for i, token, in_class in tokens:
        if in_class or token not in ("^", "$"):
            continue
        if token == "^":
            before = pattern[max(t for t in tops if t < i) + 1 : i]
            if not re.fullmatch(r"(?:\((?:\?:)?)*", before):
                return "an anchor inside it"
        else:
            after = pattern[i + 1 : min(t for t in tops if t > i)]
            if not re.fullmatch(r"\)*", after):
                return "an anchor inside it"
    return None
