"""JSON Schema ``uniqueItems`` enforced at decode time, around any grammar matcher.

No grammar backend can enforce ``uniqueItems`` (whether an item may come depends on the
items before it), so the schema is compiled without it and each request's matcher is
wrapped in a ``UniqueItemsMatcher``::

    accepted token bytes --> _Tracker: the open containers; per tracked array, the
                             equality keys of its completed items; per container
                             inside one, its completed members or elements so far
    inner.fill_bitmask   --> the backend's mask --> bits cleared for every allowed token
                             whose bytes would complete an item equal to one already seen

An array is tracked when a schema node that may apply to it says ``uniqueItems: true``.
The nodes are found lazily as containers open (``_Schema``): ``$ref``, the combinators
and ``if``'s branches are unioned, so the set over-approximates. That is safe: enforcing
uniqueness where the schema does not ask for it only narrows the output, never makes it
invalid. Items are equal as jsonschema compares them (``unique_keys``: strings by
decoded value, numbers by value, ``true`` is not ``1``, arrays elementwise, objects by
members in any order); an object or array item gets its key when its closing bracket
is read, from the keys of its parts.

A token is judged by running its bytes through a copy of the tracker (it may complete an
item mid-token, ``a",`` or ``1}]``, or even two). Most steps need not run that: per
vocabulary, tokens are classified once for the three lexer states that dominate (inside
a string, before a value, after a value) as completing nothing, completing exactly one
string item of known raw content (looked up against the seen items), or anything else
(simulated). Inside an object or array item, the tokens that may close a container
(``}``, ``"]``, ...; one table per side of a quote) are simulated too, and only while
the item agrees so far with a seen one (its completed members are among a seen
object's): other tokens complete nothing, and a new item stops costing anything once
it differs from every seen one.

Dead ends (a mask with nothing left) are prevented where they can be foreseen: a partial
enum string that can only become a seen value, a partial literal whose value was seen, a
``,`` once every value an item may take (enum, const, boolean, null, enum of objects)
is used; and a token that spells a seen item left open (``"ab`` with "ab" seen) is tried
one token ahead on the inner matcher (accept, fill, rollback), banned if only
completions equal to a seen item could follow (maxLength 2; ``0`` in an integer array).
For an object or array item, a token that spells the start of what would leave it equal
to a seen one with only its closing bracket to come (``"`` ending the last member of a
closed object, ``1`` in ``{"a":1`` under ``enum: [1, 2]``, ``true`` in ``[{"p":[true``)
is tried as many tokens ahead as the rest of that spelling may take (4 at most, 32 such
tokens a step). Not foreseen: a choice every completion of which is seen (``{"n":0,``
once both booleans of a second member were written with 0; ``[0,`` once ``[0,0]`` and
``[0,1]`` were), parts spelled otherwise than ``unique_keys.spellings`` spells them
(escapes, ``1e0``, after ``-0`` a ``0``), and deeper scalar dead ends. The mask is then
empty and the engine aborts the request (the sampler finds no allowed token).

Outside every tracked array ``fill_bitmask`` adds one test: a token that could open a
tracked array and repeat an item within itself would be judged there, and the
vocabularies we serve have none.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from functools import cached_property
from typing import Any
from urllib.parse import unquote

import numpy as np
import torch

from radixlm.runtime.constrained.base import GrammarMatcher
from radixlm.runtime.constrained.schema_refs import resolve_pointer
from radixlm.runtime.constrained.unique_keys import (
    Key,
    canonical,
    is_seen,
    number_keys,
    plain_raw,
    spellings,
    string_keys,
    value_keys,
)

__all__ = ["UniqueItemsMatcher", "UniqueItemsVocab", "UniquePlan"]

# Past this many candidate nodes for one value, every array below it is tracked (safe).
_MAX_CANDIDATES = 256
_MAX_DEPTH = 64  # of the enum-bound recursion; deeper counts as unbounded
_MAX_MEMO = 4096  # resolved (slot, key) pairs kept per schema

_WS = b" \t\n\r"
_STRUCTURAL = b'",]}[{:' + _WS
_NUMBER_BYTES = frozenset(b"0123456789+-.eE")
_LITERALS = {b"true": ("b", True), b"false": ("b", False), b"null": ("z", None)}
_LITERAL_PREFIXES = frozenset(lit[:n] for lit in _LITERALS for n in range(1, len(lit)))
_LITERAL_TEXT = {key: text for text, key in _LITERALS.items()}
_LITERAL_BY_INITIAL = {text[0]: text for text in _LITERALS}  # a literal's first letter fixes it
_INERT_BYTES = frozenset(b",]}" + _WS)  # bytes that can never complete a scalar
_VALUE_STARTS = frozenset(b'"-0123456789tfn[{]')  # "]": an empty array's end

# Lexer modes of the tracker. KEY: an object wants a key or "}"; AFTER: a value ended.
_VALUE, _KEY, _COLON, _AFTER, _STRING, _NUMBER, _LITERAL, _INVALID = range(8)
# Where the part of an object or array item being read may be spelled from, by (lexer
# mode, whether the item is an array): the bytes a token may hold before it.
_COMPOSITE_LEADS = {
    (_VALUE, False): (b"", b" "),
    (_VALUE, True): (b"", b" "),
    (_AFTER, True): (b",", b", "),  # an array's next element
    (_COLON, False): (b":", b": "),  # a member's value
    **{(mode, is_array): (b"",) for mode in (_STRING, _NUMBER, _LITERAL) for is_array in (0, 1)},
}
_LOOKAHEAD = 4  # tokens, at most, that the guard looks ahead for an object or array item
_MAX_AHEAD = 32  # tokens, at most, looked ahead from for object or array items, per fill


@dataclass(frozen=True)
class UniquePlan:
    """Which arrays in the output must hold distinct items: the checked schema (a JSON
    object in 2020-12 keywords, local ``$ref``s like ``#/$defs/x`` or
    ``#/definitions/x``) in which ``"uniqueItems": true`` marks each array the guard
    enforces. Picklable (it travels from a compile worker process to the engine), so the
    schema is kept as JSON text; its parsed index is built on first use, in the engine,
    and shared by every request of the plan."""

    schema_text: str

    @classmethod
    def from_schema(cls, schema: dict) -> UniquePlan | None:
        """The plan for ``schema``, or None when no node in it has ``uniqueItems: true``."""
        return cls(json.dumps(schema)) if _mentions_unique(schema) else None

    @cached_property
    def _index(self) -> _Schema:
        return _Schema(self.schema_text)

    def __getstate__(self) -> dict[str, Any]:
        return {"schema_text": self.schema_text}  # never the index (built per process)


def _mentions_unique(node: Any) -> bool:
    if isinstance(node, dict):
        if node.get("uniqueItems") is True:
            return True
        return any(_mentions_unique(v) for v in node.values())
    if isinstance(node, list):
        return any(_mentions_unique(v) for v in node)
    return False


# --------------------------------------------------------------------------- schema


@dataclass(frozen=True, eq=False)
class _Slot:
    """The schema nodes that may apply to one value.

    direct: the schemas written for it (before ``$ref`` and combinators are followed);
    nodes: every node reached from them (an over-approximation); wild: the expansion hit
    its cap, so every array below is tracked; prefix_len: the longest ``prefixItems``.
    """

    direct: tuple[Any, ...]
    nodes: tuple[dict, ...]
    wild: bool = False

    @cached_property
    def tracked(self) -> bool:
        return self.wild or any(n.get("uniqueItems") is True for n in self.nodes)

    @cached_property
    def ident(self) -> tuple[int, ...]:
        return tuple(id(s) for s in self.direct)

    @cached_property
    def prefix_len(self) -> int:
        lists = [n.get(k) for n in self.nodes for k in ("prefixItems", "items")]
        return max((len(v) for v in lists if isinstance(v, list)), default=0)


_NOWHERE = _Slot((), ())


@dataclass(frozen=True)
class _ItemValues:
    """A superset of the values an array item may take (from enum, const or type).

    keys: each value's equality keys; strings: (raw JSON text without quotes, keys) of the
    string values, what a partial string item is matched against."""

    keys: tuple[tuple[Key, ...], ...]
    strings: tuple[tuple[bytes, tuple[Key, ...]], ...]


class _Schema:
    """The plan's schema, parsed once, answering which nodes apply to a value (memoised:
    the schema tree stays alive, so node ids are stable keys)."""

    def __init__(self, schema_text: str) -> None:
        self.root = json.loads(schema_text, parse_float=Decimal)
        self._memo: dict[tuple, Any] = {}
        self._patterns: dict[str, re.Pattern | None] = {}
        self.root_slot = self.expand((self.root,))

    def expand(self, direct: tuple[Any, ...]) -> _Slot:
        """Every node reachable from ``direct`` through ``$ref``, ``allOf``/``anyOf``/
        ``oneOf``, ``then``/``else`` and ``dependentSchemas`` (``if`` is a condition,
        never required to hold, so it adds nothing)."""
        nodes: list[dict] = []
        visited: set[int] = set()
        pending = list(reversed(direct))
        while pending:
            node = pending.pop()
            if not isinstance(node, dict) or id(node) in visited:
                continue
            visited.add(id(node))
            nodes.append(node)
            if len(nodes) > _MAX_CANDIDATES:
                return _Slot(direct, (), wild=True)
            if isinstance(node.get("$ref"), str):
                pending.append(self.resolve(node["$ref"]))
            for keyword in ("allOf", "anyOf", "oneOf"):
                if isinstance(node.get(keyword), list):
                    pending.extend(reversed(node[keyword]))
            pending.extend((node.get("then"), node.get("else")))
            if isinstance(node.get("dependentSchemas"), dict):
                pending.extend(node["dependentSchemas"].values())
        return _Slot(direct, tuple(nodes))

    def resolve(self, ref: str) -> Any:
        """The node a local JSON-pointer ``$ref`` names, or None (remote or dangling)."""
        if not ref.startswith("#"):
            return None
        return resolve_pointer(self.root, unquote(ref[1:]))

    def member(self, slot: _Slot, key: str) -> _Slot:
        """The slot of object member ``key`` of a value in ``slot``."""
        if slot.wild or not slot.nodes:
            return slot
        return self._memoised((slot.ident, "m", key), lambda: self._member(slot, key))

    def item(self, slot: _Slot, index: int) -> _Slot:
        """The slot of item ``index`` of an array in ``slot``."""
        if slot.wild or not slot.nodes:
            return slot
        index = min(index, slot.prefix_len)
        return self._memoised((slot.ident, "i", index), lambda: self._item(slot, index))

    def item_values(self, slot: _Slot, index: int) -> _ItemValues | None:
        """A superset of the values item ``index`` of an array in ``slot`` may take, or
        None when unbounded (any string, any number, an object...)."""
        if slot.wild or not slot.direct:
            return None
        index = min(index, slot.prefix_len)
        return self._memoised((slot.ident, "v", index), lambda: self._item_values(slot, index))

    def _memoised(self, key: tuple, compute: Any) -> Any:
        if key not in self._memo:
            if len(self._memo) >= _MAX_MEMO:
                self._memo.clear()
            self._memo[key] = compute()
        return self._memo[key]

    def _member(self, slot: _Slot, key: str) -> _Slot:
        direct: list[Any] = []
        for node in slot.nodes:
            found = False
            properties = node.get("properties")
            if isinstance(properties, dict) and key in properties:
                direct.append(properties[key])
                found = True
            patterns = node.get("patternProperties")
            if isinstance(patterns, dict):
                for pattern, sub in patterns.items():
                    if self._search(pattern, key):
                        direct.append(sub)
                        found = True
            if not found:
                direct.extend(
                    node[kw]
                    for kw in ("additionalProperties", "unevaluatedProperties")
                    if isinstance(node.get(kw), dict)
                )
        return self.expand(tuple(direct)) if direct else _NOWHERE

    def _item(self, slot: _Slot, index: int) -> _Slot:
        direct = [s for s in (_item_schema(n, index) for n in slot.nodes) if s is not None]
        return self.expand(tuple(direct)) if direct else _NOWHERE

    def _search(self, pattern: str, key: str) -> bool:
        if pattern not in self._patterns:
            try:
                self._patterns[pattern] = re.compile(pattern)
            except re.error:
                self._patterns[pattern] = None  # unknown: assume it matches (safe)
        compiled = self._patterns[pattern]
        return compiled is None or compiled.search(key) is not None

    def _item_values(self, slot: _Slot, index: int) -> _ItemValues | None:
        # The array value satisfies at least one of its direct schemas' bounds: a union.
        bounds = [self._bound(s, lambda n, p: self._items_bound(n, index, p)) for s in slot.direct]
        keys = _join(bounds)
        if keys is None:
            return None
        ordered = sorted(keys, key=repr)
        strings = tuple(
            (json.dumps(k[0][1], ensure_ascii=False)[1:-1].encode(), k)
            for k in ordered
            if k[0][0] == "s"
        )
        return _ItemValues(tuple(ordered), strings)

    def _items_bound(self, node: dict, index: int, path: frozenset[int]) -> frozenset | None:
        item = _item_schema(node, index)
        return None if item is None else self._bound(item, _own_values, path)

    def _bound(self, schema: Any, own: Any, path: frozenset[int] = frozenset()) -> Any:
        """What ``own(node)`` bounds across a schema's applicators: the meet over its own
        value, ``$ref``, ``allOf``, the ``anyOf``/``oneOf`` joins and ``then``|``else``.
        None is unbounded; a cycle or a deep schema is unbounded (safe: a superset)."""
        if schema is False:
            return frozenset()
        if not isinstance(schema, dict) or id(schema) in path or len(path) > _MAX_DEPTH:
            return None
        path = path | {id(schema)}
        result = own(schema, path)
        if isinstance(schema.get("$ref"), str):
            result = _meet(result, self._bound(self.resolve(schema["$ref"]), own, path))
        for sub in schema.get("allOf") if isinstance(schema.get("allOf"), list) else ():
            result = _meet(result, self._bound(sub, own, path))
        for keyword in ("anyOf", "oneOf"):
            if isinstance(schema.get(keyword), list):
                branches = [self._bound(sub, own, path) for sub in schema[keyword]]
                result = _meet(result, _join(branches))
        if "if" in schema:
            branches = [
                self._bound(schema[k], own, path) if k in schema else None for k in ("then", "else")
            ]
            result = _meet(result, _join(branches))
        return result


def _item_schema(node: dict, index: int) -> Any:
    """The schema node ``node`` gives item ``index`` (None if it gives none)."""
    prefix = node.get("prefixItems")
    items = node.get("items")
    if isinstance(prefix, list) and index < len(prefix):
        return prefix[index]
    if isinstance(items, list):  # the pre-2020 tuple form
        return items[index] if index < len(items) else node.get("additionalItems")
    if items is not None:
        return items
    unevaluated = node.get("unevaluatedItems")
    return unevaluated if isinstance(unevaluated, dict) else None


def _own_values(node: dict, path: frozenset[int]) -> frozenset | None:
    """The values a node's own ``enum``, ``const`` and ``type`` allow (None: unbounded)."""
    result: frozenset | None = None
    if isinstance(node.get("enum"), list):
        result = _meet(result, _value_set(node["enum"]))
    if "const" in node:
        result = _meet(result, _value_set([node["const"]]))
    types = node.get("type")
    types = [types] if isinstance(types, str) else types
    literal_types = ("boolean", "null")
    if isinstance(types, list) and types and all(t in literal_types for t in types):
        literal = {"boolean": [True, False], "null": [None]}
        result = _meet(result, _value_set([v for t in types for v in literal[t]]))
    return result


def _value_set(values: Iterable[Any]) -> frozenset:
    return frozenset(value_keys(v) for v in values)


def _meet(a: frozenset | None, b: frozenset | None) -> frozenset | None:
    return b if a is None else a if b is None else a & b


def _join(bounds: Sequence[frozenset | None]) -> frozenset | None:
    if any(b is None for b in bounds):
        return None
    return frozenset().union(*bounds)


# --------------------------------------------------------------------------- tracker


class _Frame:
    """One open container. Arrays count their items and, when tracked, keep the keys of
    their completed items (and how the scalar strings and numbers among them are spelled
    plainly, what the token lookups match; the objects and arrays among them apart, in
    ``composites``); objects keep the key of the member being read. ``guarded``: this
    frame or one enclosing it is a tracked array. ``builds``: one enclosing it is, so
    this container is (inside) an item and ``value`` records its completed members
    (name key -> canonical key) or elements (canonical keys). ``owner``: the tracker
    that may mutate it (probes copy a frame before their first write)."""

    __slots__ = (
        "is_array", "slot", "tracked", "guarded", "builds", "index", "key", "name", "value",
        "seen", "strings", "numbers", "composites", "agreement", "owner",
    )  # fmt: skip

    def __init__(self, is_array: bool, slot: _Slot, guarded: bool, owner: object) -> None:
        self.is_array = is_array
        self.slot = slot
        self.tracked = is_array and slot.tracked
        self.guarded = guarded or self.tracked
        self.builds = guarded
        self.index = 0
        self.key = ""
        self.name: Key = ("s", "")  # the member being read, as a key (when it builds)
        self.value: Any = ([] if is_array else {}) if guarded else None
        self.seen: set[Key] = set()
        self.strings: list[bytes] = []  # seen strings' raw JSON, those with no escape
        self.numbers: list[bytes] = []  # seen numbers as str(Decimal) spells them
        self.composites: list[Key] = []  # seen objects' and arrays' keys (replaced, not mutated)
        self.agreement: bool | None = None  # may_become's answer, until value changes
        self.owner = owner

    def copy_for(self, owner: object) -> _Frame:
        frame = _Frame.__new__(_Frame)
        frame.is_array, frame.slot, frame.tracked = self.is_array, self.slot, self.tracked
        frame.guarded, frame.builds, frame.index = self.guarded, self.builds, self.index
        frame.key, frame.name = self.key, self.name
        frame.value = None if self.value is None else self.value.copy()
        frame.seen, frame.owner = set(self.seen), owner
        frame.strings, frame.numbers = list(self.strings), list(self.numbers)
        frame.composites, frame.agreement = self.composites, self.agreement  # never mutated
        return frame

    def closed_key(self) -> Key:
        """The canonical key of this container's value, once it is closed."""
        if self.is_array:
            return ("a", tuple(self.value))
        return ("o", frozenset(self.value.items()))

    def may_become(self, composites: list[Key]) -> bool:
        """Whether this open item agrees so far with one of ``composites``, the seen
        items of the array holding it (its completed members are among one's, or its
        completed elements begin one). Kept until the value changes: the array's items
        do not change while this one is open."""
        if self.agreement is None:
            done = self.value
            if self.is_array:
                n = len(done)
                agrees = any(k[0] == "a" and list(k[1][:n]) == done for k in composites)
            else:
                agrees = any(k[0] == "o" and done.items() <= k[1] for k in composites)
            self.agreement = agrees
        return self.agreement


class _Tracker:
    """An incremental JSON scanner over the output's bytes: the container stack and the
    lexer state of the scalar being read. ``feed`` reports a violation (an item equal to
    one seen, or a new item once an enum is used up) and stops there."""

    def __init__(self, schema: _Schema) -> None:
        self.schema = schema
        self.stack: list[_Frame] = []
        self.mode = _VALUE
        self.buf = bytearray()  # the raw bytes of the scalar being read
        self.escape = False  # the string's last byte was an unescaped backslash
        self.in_key = False  # a string is being read, and it is an object key

    def clone(self) -> _Tracker:
        probe = _Tracker.__new__(_Tracker)
        probe.schema, probe.stack, probe.mode = self.schema, list(self.stack), self.mode
        probe.buf, probe.escape, probe.in_key = bytearray(self.buf), self.escape, self.in_key
        return probe

    @property
    def guarded(self) -> bool:
        return bool(self.stack) and self.stack[-1].guarded

    def feed(self, data: bytes) -> bool:
        """Advances over ``data``; False at the first violation (the state is then moot)."""
        for c in data:
            mode = self.mode
            if mode == _STRING:
                if self.escape:
                    self.escape = False
                elif c == 0x5C:
                    self.escape = True
                elif c == 0x22:
                    if not self._end_string():
                        return False
                    continue
                self.buf.append(c)
            elif mode == _NUMBER and c in _NUMBER_BYTES:
                self.buf.append(c)
            elif mode == _LITERAL:
                self.buf.append(c)
                literal = bytes(self.buf)
                if literal in _LITERALS:
                    if not self._end_item(_LITERAL):
                        return False
                elif literal not in _LITERAL_PREFIXES:
                    self.mode = _INVALID
            elif mode != _INVALID:
                if mode == _NUMBER and not self._end_item(_NUMBER):
                    return False
                if not self._structural(c):
                    return False
        return True

    def item_values(self) -> _ItemValues | None:
        """The bounded values of the top array's current item (None: unbounded)."""
        top = self.stack[-1]
        return self.schema.item_values(top.slot, top.index) if top.tracked else None

    def enum_here(self) -> bool:
        """Whether the top array is tracked and its current or next item is bounded."""
        top = self.stack[-1]
        if not top.tracked:
            return False
        if self.schema.item_values(top.slot, top.index) is not None:
            return True
        return self.mode == _AFTER and self.schema.item_values(top.slot, top.index + 1) is not None

    def dead_partial(self) -> bool:
        """Whether the literal item being read, or the string item being read (of an
        enum), can only become a value already seen."""
        if not self.stack or not self.stack[-1].tracked:
            return False
        if self.mode == _LITERAL:
            literal = _LITERAL_BY_INITIAL.get(self.buf[0])
            return literal is not None and _LITERALS[literal] in self.stack[-1].seen
        if self.mode != _STRING or self.in_key:
            return False
        values = self.item_values()
        if values is None:
            return False
        seen, partial = self.stack[-1].seen, bytes(self.buf)
        matches = [keys for raw, keys in values.strings if raw.startswith(partial)]
        return bool(matches) and all(is_seen(keys, seen) for keys in matches)

    def _structural(self, c: int) -> bool:
        """A byte outside any scalar; False on a violation."""
        mode = self.mode
        if c in _WS:
            return True
        if c == 0x22 and mode in (_VALUE, _KEY):
            self.mode, self.in_key, self.escape = _STRING, mode == _KEY, False
            self.buf.clear()
        elif c in b"[{" and mode == _VALUE:
            self._push(c == 0x5B)
        elif c in b"]}" and mode in (_VALUE, _KEY, _AFTER) and self.stack:
            closed = self.stack.pop()
            self.mode = _AFTER
            if closed.builds:  # an item, or a value inside one, is complete
                return self._record((closed.closed_key(),))
        elif c == 0x2C and mode == _AFTER and self.stack:
            return self._next_member()
        elif c == 0x3A and mode == _COLON:
            self.mode = _VALUE
        elif mode == _VALUE and (c in _NUMBER_BYTES):
            self.mode = _NUMBER
            self.buf[:] = bytes((c,))
        elif mode == _VALUE and c in b"tfn":
            self.mode = _LITERAL
            self.buf[:] = bytes((c,))
        else:
            self.mode = _INVALID
        return True

    def _push(self, is_array: bool) -> None:
        top = self.stack[-1] if self.stack else None
        if top is None:
            slot = self.schema.root_slot
        elif top.is_array:
            slot = self.schema.item(top.slot, top.index)
        else:
            slot = self.schema.member(top.slot, top.key)
        guarded = top is not None and top.guarded
        self.stack.append(_Frame(is_array, slot, guarded, self))
        self.mode = _VALUE if is_array else _KEY

    def _writable_top(self) -> _Frame:
        top = self.stack[-1]
        if top.owner is not self:
            top = self.stack[-1] = top.copy_for(self)
        return top

    def _next_member(self) -> bool:
        if not self.stack[-1].is_array:
            self.mode = _KEY
            return True
        top = self._writable_top()
        top.index += 1
        self.mode = _VALUE
        if top.tracked and top.seen:
            values = self.item_values()
            if values is not None and all(is_seen(keys, top.seen) for keys in values.keys):
                return False  # every value the item may take is used: no item can follow
        return True

    def _end_string(self) -> bool:
        self.mode = _AFTER
        if not self.in_key:
            return self._end_item(_STRING)
        top = self._writable_top()
        if top.builds or top.slot.nodes or top.slot.wild:  # it matters to a schema below
            keys = string_keys(bytes(self.buf))
            top.key = keys[0][1] if keys[0][0] == "s" else ""
            top.name = keys[0]
        self.mode, self.in_key = _COLON, False  # a number read next is no key
        return True

    def _end_item(self, kind: int) -> bool:
        """A scalar value of lexer mode ``kind`` ended; its raw bytes are in ``buf``."""
        self.mode = _AFTER
        if not self.stack or not (self.stack[-1].tracked or self.stack[-1].builds):
            return True
        raw = bytes(self.buf)
        if kind == _STRING:
            keys = string_keys(raw)
        elif kind == _NUMBER:
            keys = number_keys(raw)
        else:
            keys = (_LITERALS[raw],)
        return self._record(keys)

    def _record(self, keys: tuple[Key, ...]) -> bool:
        """A value of keys ``keys`` completed inside the top frame: an item of a tracked
        array (False if one seen equals it) and/or a part of an item being built."""
        top = self._writable_top()
        if top.builds:
            top.agreement = None
            if top.is_array:
                top.value.append(canonical(keys))
            else:  # a repeated name: the last one counts, as json.loads reads it
                top.value[top.name] = canonical(keys)
        if not top.tracked:
            return True
        if is_seen(keys, top.seen):
            return False
        top.seen.update(keys)
        kind = keys[0][0]
        if kind == "s" and (plain := plain_raw(keys[0])) is not None:
            top.strings.append(plain)
        elif kind == "n":
            top.numbers.append(str(keys[0][1]).encode())
        elif kind in ("a", "o"):
            top.composites = [*top.composites, keys[0]]  # copies may share the old list
        return True

    def may_repeat_composite(self) -> bool:
        """Whether closing containers could complete an object or array item equal to
        one seen: an open item agrees so far with a seen one."""
        stack = self.stack
        for i in range(len(stack) - 1):
            composites = stack[i].composites  # only a tracked array's
            if composites and stack[i + 1].may_become(composites):
                return True
        return False


# --------------------------------------------------------------------------- vocabulary


_COMPLEX = object()  # a token's effect needs simulating


@dataclass(frozen=True, eq=False)
class _TokenTable:
    """Tokens classified for one lexer state: ``complex_words`` (packed like a bitmask
    row) must be simulated;
    ``simple[raw]`` are the ids that complete exactly one string item, of raw content
    ``raw`` (without quotes or backslashes), and then nothing else; the rest complete
    nothing."""

    complex_words: np.ndarray
    simple: dict[bytes, np.ndarray]


class UniqueItemsVocab:
    """Per-vocabulary tables built once per backend and shared by its requests.

    Attributes:
        token_bytes: index = token id; None for special tokens and EOS.
        vocab_size: V, the bitmask's meaningful width.
        structural: (V,) bool, the tokens holding a structural byte (``"`` ``,`` ``]``
            ``}`` ``[`` ``{`` ``:`` or JSON whitespace).
        repeating_tokens: the ids that alone can complete two equal items of one array
            (judged even outside tracked arrays; usually none).
        ids_by_bytes: bytes -> the ids spelling them (the lookahead's candidates).
        blank_words: packed like a bitmask row, the tokens of JSON whitespace only.
    """

    def __init__(self, token_bytes: Sequence[bytes | None], vocab_size: int) -> None:
        padded = list(token_bytes[:vocab_size]) + [None] * (vocab_size - len(token_bytes))
        self.token_bytes: tuple[bytes | None, ...] = tuple(padded)
        self.vocab_size = vocab_size
        self.structural = self._holding(_STRUCTURAL)
        self.num_words = (vocab_size + 31) // 32
        self.quote_words = _pack(self._holding(b'"'))
        # A literal item ends at its last letter: "true" completes with no structural byte.
        self.may_complete = self.structural | self._holding(b"el")
        self.may_complete_words = _pack(self.may_complete)
        self.blank_words = _pack(self._only(_WS))
        # Tokens that could open a tracked array and fill it with two equal items: what
        # must be judged outside tracked arrays (none, in the vocabularies we serve).
        opening = np.flatnonzero(self._holding(b"[") & self._holding(b","))
        repeating = [t for t in opening.tolist() if _repeats_within(self.token_bytes[t])]
        self.repeating_tokens = np.array(repeating, dtype=np.int64)
        self.ids_by_bytes: dict[bytes, list[int]] = {}
        for token, piece in enumerate(self.token_bytes):
            if piece:
                self.ids_by_bytes.setdefault(piece, []).append(token)

    def _only(self, chars: bytes) -> np.ndarray:
        return np.array(
            [bool(piece) and all(c in chars for c in piece) for piece in self.token_bytes],
            dtype=np.bool_,
        )

    @cached_property
    def closing(self) -> np.ndarray:
        """Packed: the tokens that, read outside a string, close a container."""
        return self._closing(in_string=False)

    @cached_property
    def closing_in_string(self) -> np.ndarray:
        """Packed: the tokens that, read inside a string, end it and close a container."""
        return self._closing(in_string=True)

    @cached_property
    def _bracket_ids(self) -> list[int]:
        return np.flatnonzero(self._holding(b"]}")).tolist()

    def _closing(self, in_string: bool) -> np.ndarray:
        mask = np.zeros(self.vocab_size, dtype=np.bool_)
        for token in self._bracket_ids:
            mask[token] = _closes(self.token_bytes[token], in_string)
        return _pack(mask)

    def _holding(self, chars: bytes) -> np.ndarray:
        return np.array(
            [piece is not None and any(c in piece for c in chars) for piece in self.token_bytes],
            dtype=np.bool_,
        )

    @cached_property
    def in_string(self) -> _TokenTable:
        return self._table(_classify_in_string, self._holding(b'"'))

    @cached_property
    def at_value(self) -> _TokenTable:
        return self._table(_classify_at_value, self.may_complete)

    @cached_property
    def after_value(self) -> _TokenTable:
        return self._table(_classify_after_value, self.may_complete)

    def _table(self, classify: Any, candidates: np.ndarray) -> _TokenTable:
        complex_ = np.zeros(self.vocab_size, dtype=np.bool_)
        simple: dict[bytes, list[int]] = {}
        for token in np.flatnonzero(candidates).tolist():
            verdict = classify(self.token_bytes[token])
            if verdict is _COMPLEX:
                complex_[token] = True
            elif verdict is not None:
                simple.setdefault(verdict, []).append(token)
        arrays = {raw: np.array(ids, dtype=np.int64) for raw, ids in simple.items()}
        return _TokenTable(_pack(complex_), arrays)


# Every array tracked, at any depth: the context in which a token could repeat an item.
_EVERYWHERE = '{"uniqueItems": true, "items": {"$ref": "#"}, "additionalProperties": {"$ref": "#"}}'
_STARTS = (b"", b"[", b'["', b'["x"', b"[1", b'{"')  # root, item, in a string, after, ...


def _repeats_within(piece: bytes) -> bool:
    """Whether ``piece`` alone can complete two equal scalar items of one array, from
    any lexer state it may follow."""
    schema = _Schema(_EVERYWHERE)
    for start in _STARTS:
        tracker = _Tracker(schema)
        tracker.feed(start)
        if not tracker.feed(piece):
            return True
    return False


def _rests_to_a_seen_item(tracker: _Tracker) -> list[tuple[tuple[bytes, ...], bytes]]:
    """What may follow the output (the bytes a token may hold before it, then the
    rest) so that an object or array item of the nearest tracked array below the top
    frame equals a seen one once closed, its closing bracket not included::

        [{"a":1,"p":[true]},{"a":1,"p":[t      seen item, the item being written
                                         rue]  a rest: "p" completes the item

    Found through the frames from the item to the top, each the part its parent
    misses to equal a target (``_last_parts``). Not foreseen: parts spelled otherwise
    than ``spellings`` spells them (escapes, ``1e0``), an object part's members, a
    token that begins with a key's closing quote, items of an outer tracked array."""
    stack, mode = tracker.stack, tracker.mode
    if mode == _STRING and (tracker.in_key or tracker.escape):
        return []
    tracked = next((i for i in range(len(stack) - 2, -1, -1) if stack[i].composites), None)
    if tracked is None or not stack[tracked + 1].may_become(stack[tracked].composites):
        return []
    targets = stack[tracked].composites
    for parent, child in zip(stack[tracked + 1 : -1], stack[tracked + 2 :]):
        kind = "a" if child.is_array else "o"
        targets = [v for v in _last_parts(parent, targets) if v[0] == kind]
        if not targets:
            return []
    top = stack[-1]
    closers = bytes(0x5D if f.is_array else 0x7D for f in reversed(stack[tracked + 2 :]))
    rests = []
    if len(stack) - tracked > 2 and (mode == _AFTER or (mode in (_VALUE, _KEY) and not top.value)):
        if top.closed_key() in targets:  # the top container is the part: close it
            rests.append(((b"",), closers))
    leads = _COMPOSITE_LEADS.get((mode, top.is_array))
    if leads is None:
        return rests
    # What of the part is written: its string's opening quote and bytes, or the number
    # or literal so far; nothing before its first byte.
    written = bytes(tracker.buf) if mode in (_STRING, _NUMBER, _LITERAL) else b""
    written = b'"' + written if mode == _STRING else written
    for part in _last_parts(top, targets):
        for text in spellings(part):
            if text.startswith(written):
                rests.append((leads, text[len(written) :] + closers))
    return rests


def _last_parts(item: _Frame, targets: Iterable[Key]) -> list[Key]:
    """The values that, completing the part of ``item`` being read, make it equal one
    of ``targets`` missing only that part: for an object, the member named
    ``item.name``; for an array, its next element."""
    done = item.value
    if item.is_array:
        n = len(done)
        return [k[1][n] for k in targets if k[0] == "a" and len(k[1]) == n + 1
                and list(k[1][:n]) == done]  # fmt: skip
    if item.name in done:
        return []
    parts = []
    for k in targets:
        if k[0] == "o" and len(k[1]) == len(done) + 1 and done.items() <= k[1]:
            parts.extend(value for name, value in k[1] if name == item.name)
    return parts


def _closes(piece: bytes, in_string: bool) -> bool:
    """Whether ``piece``, read from inside a string (no escape pending) or outside one,
    reaches a ``]`` or ``}`` outside every string."""
    escape = False
    for c in piece:
        if in_string:
            if escape:
                escape = False
            elif c == 0x5C:
                escape = True
            elif c == 0x22:
                in_string = False
        elif c == 0x22:
            in_string = True
        elif c in b"]}":
            return True
    return False


def _survivors_certain(
    words: np.ndarray, tracker: _Tracker, vocab: UniqueItemsVocab, ahead: Iterable[int] = ()
) -> bool:
    """Whether some allowed token surely completes no item from ``tracker``'s state
    (inside a string, one without a quote; elsewhere, one with no structural byte and
    no literal's last letter) and is none of ``ahead`` (those a look ahead judges),
    and no enum or literal rule judges every token."""
    if tracker.mode == _LITERAL or tracker.enum_here():
        return False
    candidates = vocab.quote_words if tracker.mode == _STRING else vocab.may_complete_words
    live = words[: vocab.num_words] & ~candidates
    _clear_bits(live, list(ahead))
    return bool(live.any())


def _classify_in_string(piece: bytes) -> Any:
    """Inside a string (no escape pending): None, the raw head it completes, or _COMPLEX."""
    quote = piece.find(b'"')
    if quote < 0:
        return None
    head = piece[:quote]
    if b"\\" in head or not _completes_nothing(piece[quote + 1 :]):
        return _COMPLEX
    return head


def _classify_at_value(piece: bytes) -> Any:
    rest = piece.lstrip(_WS)
    if not rest:
        return None
    if rest[0] == 0x22:
        return None if b'"' not in rest[1:] else _classify_in_string(rest[1:])
    if all(c in _NUMBER_BYTES for c in rest) or rest in _LITERAL_PREFIXES:
        return None  # a number or a literal still open
    return _COMPLEX if rest[0] in _VALUE_STARTS else None  # else not JSON: never allowed


def _classify_after_value(piece: bytes) -> Any:
    rest = piece.lstrip(_WS)
    if not rest:
        return None
    if rest[0] == 0x2C:
        return _classify_at_value(rest[1:])
    if rest[0] in b"]}":
        return None if _completes_nothing(rest) else _COMPLEX
    return None  # not JSON after a value: never allowed


def _completes_nothing(tail: bytes) -> bool:
    """Whether bytes after a value can complete no scalar: only ``,]}`` and whitespace,
    then at most an opening quote of a string that stays open."""
    quote = tail.find(b'"')
    before = tail if quote < 0 else tail[:quote]
    return all(c in _INERT_BYTES for c in before) and (quote < 0 or b'"' not in tail[quote + 1 :])


# --------------------------------------------------------------------------- matcher


class UniqueItemsMatcher:
    """A request's grammar matcher with ``uniqueItems`` enforced on top (a
    ``GrammarMatcher`` itself).

    Args:
        inner: the backend's matcher for the schema compiled without ``uniqueItems``.
        plan: which arrays must hold distinct items.
        vocab: the backend's ``UniqueItemsVocab``.
    """

    def __init__(self, inner: GrammarMatcher, plan: UniquePlan, vocab: UniqueItemsVocab) -> None:
        self._inner = inner
        self._plan = plan
        self._vocab = vocab
        self._tracker = _Tracker(plan._index)
        self._accepted: list[bytes] = []  # each accepted token's bytes, for rollback
        self._scratch: dict[int, torch.Tensor] = {}  # the lookahead's rows, by depth

    def accept_token(self, token_id: int) -> bool:
        piece = self._piece(token_id)
        # A token completing a duplicate is refused however it comes (jump-forward's);
        # the dead-end bans are the mask's alone.
        if self._may_violate(piece) and not self._tracker.clone().feed(piece):
            return False
        if not self._inner.accept_token(token_id):
            return False
        self._tracker.feed(piece)
        self._accepted.append(piece)
        return True

    def rollback(self, num_tokens: int) -> None:
        if num_tokens <= 0:
            return
        self._inner.rollback(num_tokens)
        del self._accepted[-num_tokens:]
        self._tracker = _Tracker(self._plan._index)  # rare: re-scanning is cheap enough
        for piece in self._accepted:
            self._tracker.feed(piece)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self._inner.fill_bitmask(bitmask, row)
        if not self._tracker.guarded and not self._vocab.repeating_tokens.size:
            return  # the common case, outside every tracked array: nothing to judge
        words = bitmask[row].numpy().view(np.uint32)  # shares the tensor's memory
        if self._tracker.guarded:
            banned = self._banned(words, _LOOKAHEAD)
        else:
            banned = self._probe(_allowed_among(words, self._vocab.repeating_tokens))
        _clear_bits(words, banned)

    def is_terminal(self) -> bool:
        return self._inner.is_terminal()

    def forced_string(self) -> str:
        # Jump-forward must not append text the guard has not checked.
        return "" if self._tracker.guarded else self._inner.forced_string()

    def _piece(self, token_id: int) -> bytes:
        if 0 <= token_id < self._vocab.vocab_size:
            return self._vocab.token_bytes[token_id] or b""
        return b""

    def _may_violate(self, piece: bytes) -> bool:
        return self._tracker.guarded or (b"[" in piece and _repeats_within(piece))

    def _banned(self, words: np.ndarray, budget: int) -> list[int]:
        """The allowed tokens that would complete a duplicate (inside a tracked array) or,
        looking up to ``budget`` tokens ahead, leave an item that can only end as one."""
        banned = self._completing_duplicates(words)
        if budget > 0:
            banned.extend(self._dead_ends(words, set(banned), budget))
        return banned

    def _completing_duplicates(self, words: np.ndarray) -> list[int]:
        tracker, vocab = self._tracker, self._vocab
        words = words[: vocab.num_words]
        top, mode = tracker.stack[-1], tracker.mode
        if mode == _LITERAL or tracker.enum_here():
            return self._probe(_set_ids(words))  # few tokens: the grammar's enum
        table = self._table(mode)
        if table is None:  # the candidates hold every closing bracket
            candidates = vocab.quote_words if mode == _STRING else vocab.may_complete_words
            return self._probe(_set_ids(words & candidates))
        probed = table.complex_words
        if top.builds and tracker.may_repeat_composite():
            # A "]" or "}" may close an object or array item equal to a seen one.
            probed = probed | (vocab.closing_in_string if mode == _STRING else vocab.closing)
        banned = self._probe(_set_ids(words & probed))
        if top.tracked and top.seen and not (mode == _STRING and tracker.in_key):
            prefix = bytes(tracker.buf) if mode == _STRING else b""
            for raw in top.strings:
                if raw.startswith(prefix) and raw[len(prefix) :] in table.simple:
                    banned.extend(table.simple[raw[len(prefix) :]].tolist())
        return banned

    def _dead_ends(self, words: np.ndarray, banned: set[int], budget: int) -> list[int]:
        """Allowed tokens that make the item being read equal a seen one, after which
        the grammar allows only its completion (``"ab`` under maxLength 2 with "ab"
        seen; ``0`` in an integer array with 0 seen; ``"`` ending the last member an
        object item may have, when the object is then a seen one): the inner matcher is
        asked, one token ahead for a scalar item, for a part of an object or array item
        as many tokens ahead as the rest of its spelling may take (``budget`` at most).
        Deeper dead ends (every longer item also seen) are not foreseen."""
        dead = []
        for token, depth in self._ahead(budget).items():
            if token in banned or not _allowed_among(words, np.array([token])).size:
                continue
            probe = self._tracker.clone()
            if not probe.feed(self._vocab.token_bytes[token] or b"") or probe.dead_partial():
                dead.append(token)
            elif self._leads_nowhere(token, probe, words.size, depth):
                dead.append(token)
        return dead

    def _ahead(self, budget: int) -> dict[int, int]:
        """The tokens a look ahead judges -> how many tokens ahead (``budget`` at most)."""
        ahead = dict.fromkeys(self._lookahead_tokens(), 1)
        if not self._tracker.stack[-1].builds:  # no object or array item is open
            return ahead
        composite = sorted(self._composite_lookahead().items(), key=lambda kv: kv[1])
        for token, depth in composite[:_MAX_AHEAD]:  # the nearest ends first
            ahead[token] = max(ahead.get(token, 0), min(depth, budget))
        return ahead

    def _lookahead_tokens(self) -> set[int]:
        """The tokens whose bytes, appended, spell a seen item left open (those a dead
        end can follow), in the states a seen item's spelling can be resumed from."""
        tracker = self._tracker
        top, mode = tracker.stack[-1], tracker.mode
        if not top.tracked or not top.seen:
            return set()
        strings, numbers = top.strings, top.numbers
        literals = [_LITERAL_TEXT[k] for k in top.seen if k in _LITERAL_TEXT]
        if mode in (_STRING, _NUMBER):
            if tracker.in_key or tracker.escape:
                return set()
            buf = bytes(tracker.buf)
            spelled = strings if mode == _STRING else numbers
            pieces = [raw[len(buf) :] for raw in spelled if raw.startswith(buf)]
        elif mode in (_VALUE, _AFTER):
            starts = [b'"' + raw for raw in strings] + numbers
            starts += [text[:n] for text in literals for n in range(1, len(text))]
            leads = (b"", b" ") if mode == _VALUE else (b",", b", ")
            pieces = [lead + start for lead in leads for start in starts]
        else:
            return set()
        ids_by_bytes = self._vocab.ids_by_bytes
        return {token for piece in pieces if piece for token in ids_by_bytes.get(piece, ())}

    def _composite_lookahead(self) -> dict[int, int]:
        """The tokens (-> how many tokens ahead to look) that spell a start of what
        would leave an object or array item of the nearest tracked array equal to a
        seen one, with only its closing bracket missing: the rest of the seen item's
        missing part (a scalar, ``spellings``, or a container being written, with its
        closing bracket), each of its bytes possibly a token of its own."""
        pieces: dict[bytes, int] = {}
        for leads, rest in _rests_to_a_seen_item(self._tracker):
            for lead in leads:
                for end in range(1, len(rest) + 1):
                    piece, depth = lead + rest[:end], len(rest) - end + 1
                    pieces[piece] = max(pieces.get(piece, 0), depth)
        ids_by_bytes = self._vocab.ids_by_bytes
        return {
            token: depth for piece, depth in pieces.items() for token in ids_by_bytes.get(piece, ())
        }

    def _leads_nowhere(self, token: int, probe: _Tracker, width: int, depth: int) -> bool:
        """Whether, after ``token`` (``probe`` is the tracker past it), the inner grammar
        allows no token the guard would keep (looking ``depth - 1`` tokens further).
        Past a value (``probe`` after it) whitespace alone counts as nothing: it leads
        back to the same choice."""
        if not self._inner.accept_token(token):
            return False
        try:
            scratch = self._scratch.get(depth)
            if scratch is None or scratch.shape[1] != width:
                scratch = self._scratch[depth] = torch.zeros(1, width, dtype=torch.int32)
            self._inner.fill_bitmask(scratch, 0)
            words = scratch[0].numpy().view(np.uint32)
            saved, self._tracker = self._tracker, probe
            try:
                ahead = self._ahead(depth - 1) if depth > 1 else {}
                if _survivors_certain(words, probe, self._vocab, ahead):
                    return False
                _clear_bits(words, self._banned(words, depth - 1))
            finally:
                self._tracker = saved
            if probe.mode == _AFTER:
                return not (words[: self._vocab.num_words] & ~self._vocab.blank_words).any()
            return not words.any()
        finally:
            self._inner.rollback(1)

    def _table(self, mode: int) -> _TokenTable | None:
        """The precomputed classification for the tracker's state, if one applies."""
        tracker, vocab = self._tracker, self._vocab
        if mode == _STRING:
            plain = not tracker.escape and b"\\" not in tracker.buf
            return vocab.in_string if plain else None
        if mode in (_VALUE, _KEY):  # a key completes no item: a value's table is sound
            return vocab.at_value
        return vocab.after_value if mode == _AFTER else None

    def _probe(self, token_ids: Iterable[int]) -> list[int]:
        """The tokens among ``token_ids`` whose bytes, fed to a copy of the tracker,
        complete a duplicate, start an item past an exhausted enum, or leave a partial
        string item that can only become a seen value."""
        banned = []
        token_bytes = self._vocab.token_bytes
        for token in np.asarray(token_ids).tolist():
            piece = token_bytes[token] if token < len(token_bytes) else None
            if piece is None:
                continue
            probe = self._tracker.clone()
            if not probe.feed(piece) or probe.dead_partial():
                banned.append(token)
        return banned


def _allowed_among(words: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The ids among ``ids`` whose bits are set in a bitmask row."""
    if not ids.size:
        return ids
    return ids[((words[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1) == 1]


def _clear_bits(words: np.ndarray, token_ids: Sequence[int]) -> None:
    """Clears the tokens' bits in a (W,) uint32 bitmask row, in place."""
    if len(token_ids):
        ids = np.asarray(token_ids, dtype=np.int64)
        np.bitwise_and.at(words, ids >> 5, ~(np.uint32(1) << (ids & 31).astype(np.uint32)))


def _pack(mask: np.ndarray) -> np.ndarray:
    """(V,) bool -> (ceil(V / 32),) uint32, laid out as a bitmask row."""
    padded = np.zeros((len(mask) + 31) // 32 * 32, dtype=np.bool_)
    padded[: len(mask)] = mask
    return np.packbits(padded, bitorder="little").view(np.uint32)


def _set_ids(words: np.ndarray) -> np.ndarray:
    """The token ids whose bits are set in a (W,) uint32 row, ascending; only the
    nonzero words are unpacked (a row masked to the few candidates is sparse)."""
    nonzero = np.flatnonzero(words)
    bits = np.unpackbits(words[nonzero].view(np.uint8), bitorder="little").reshape(-1, 32)
    rows, cols = np.nonzero(bits)
    return nonzero[rows] * 32 + cols
