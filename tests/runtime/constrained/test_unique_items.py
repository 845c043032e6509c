"""UniqueItemsMatcher: uniqueItems enforced on a backend's mask, over a tiny hand-built
vocabulary (a fake inner matcher allows every token, so each ban the guard adds shows),
then end to end on llguidance over the default model's vocabulary."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from radixlm.kernels.bitmask import allowed_token_ids, bitmask_width
from radixlm.runtime.constrained.unique_items import (
    UniqueItemsMatcher,
    UniqueItemsVocab,
    UniquePlan,
)

PIECES: list[bytes | None] = [
    None,  # EOS
    *[b"[", b"]", b",", b'"', b"a", b"b", b"{", b"}", b":", b" ", b"x", b"e", b"0"],
    *[b'"a"', b'","', b'"]', b'"a",', b'"a"]', b'"b"', b'"a', b'"a","a"', b' "a"'],
    *[b'a"', b'a",', b'a"]', b'"\\u0061"', b'\\u0061"', b'"tags"', b'"other"', b'"kids"'],
    *[b"1", b"2", b"1.0", b"1]", b"1,", b"1.0]", b"1e0]", b"2]", b".0", b"0]"],
    *[b"true", b"tru", b"true]", b"false", b"null", b'["a","a"', b"ab", b'"ab'],
]
ID = {piece: i for i, piece in enumerate(PIECES) if piece is not None}
EVERY = frozenset(ID.values())
V = len(PIECES)

STRINGS = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}


class AllowAll:
    """A grammar that allows every token except EOS (or ``allowed``), accepts anything,
    and forces ``forced``."""

    def __init__(self, allowed: frozenset[int] = EVERY, forced: str = "") -> None:
        self.allowed, self.forced = allowed, forced
        self.accepted: list[int] = []

    def accept_token(self, token_id: int) -> bool:
        self.accepted.append(token_id)
        return True

    def rollback(self, num_tokens: int) -> None:
        del self.accepted[len(self.accepted) - num_tokens :]

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        bitmask[row].zero_()
        for token in self.allowed:
            word, bit = divmod(token, 32)
            value = (int(bitmask[row, word]) & 0xFFFFFFFF) | (1 << bit)
            bitmask[row, word] = value - (1 << 32) if value >= 1 << 31 else value

    def is_terminal(self) -> bool:
        return False

    def forced_string(self) -> str:
        return self.forced


@pytest.fixture(scope="module")
def model_vocab(vocab) -> UniqueItemsVocab:
    return UniqueItemsVocab(vocab.token_bytes, vocab.vocab_size)


@pytest.fixture(scope="module")
def tiny_vocab() -> UniqueItemsVocab:
    return UniqueItemsVocab(PIECES, V)


def guard(schema: dict, vocab: UniqueItemsVocab, inner: AllowAll | None = None):
    plan = UniquePlan.from_schema(schema)
    assert plan is not None
    return UniqueItemsMatcher(inner or AllowAll(), plan, vocab)


def feed(matcher: UniqueItemsMatcher, *pieces: bytes) -> None:
    for piece in pieces:
        assert matcher.accept_token(ID[piece]), piece


def allowed(matcher, vocab_size: int = V) -> set[int]:
    bitmask = torch.zeros(1, bitmask_width(vocab_size), dtype=torch.int32)
    matcher.fill_bitmask(bitmask, 0)
    return set(allowed_token_ids(bitmask[0], vocab_size).tolist())


def banned(matcher) -> set[bytes]:
    return {PIECES[t] for t in EVERY - allowed(matcher)}


def test_plan_only_for_schemas_with_unique_items_and_pickles():
    assert UniquePlan.from_schema({"type": "array", "items": {"type": "string"}}) is None
    assert UniquePlan.from_schema({"type": "array", "uniqueItems": False}) is None
    plan = UniquePlan.from_schema({"properties": {"t": STRINGS}})
    assert plan is not None and json.loads(plan.schema_text) == {"properties": {"t": STRINGS}}
    assert plan._index.root_slot.nodes  # built, but never pickled
    assert pickle.loads(pickle.dumps(plan)) == plan


def test_structural_tokens(tiny_vocab):
    structural = {PIECES[t] for t in tiny_vocab.structural.nonzero()[0].tolist()}
    assert {b"[", b'"a"', b" ", b"1]", b"true]"} <= structural
    assert not {b"a", b"1", b"true", b"tru", b"1.0", b"e"} & structural


def test_string_items_ban_every_token_completing_a_seen_value(tiny_vocab):
    matcher = guard(STRINGS, tiny_vocab)
    feed(matcher, b"[", b'"a"', b",")
    # "\u0061" decodes to "a": equal by value; '"a","a"' completes it twice.
    assert banned(matcher) == {b'"a"', b'"a",', b'"a"]', b'"a","a"', b'"\\u0061"', b' "a"'}
    feed(matcher, b'"')
    assert banned(matcher) == {b'a"', b'a",', b'a"]', b'\\u0061"'}
    feed(matcher, b"a")  # the partial item "a": every closing quote repeats "a"
    assert banned(matcher) == {p for p in ID if p.startswith(b'"')}
    feed(matcher, b"b")  # "ab" is new
    assert banned(matcher) == set()


def test_a_token_repeating_an_item_within_itself_is_banned(tiny_vocab):
    matcher = guard(STRINGS, tiny_vocab)
    assert banned(matcher) == {b'["a","a"'}  # outside the array yet: it opens it
    feed(matcher, b"[")
    assert banned(matcher) == {b'"a","a"'}  # '["a","a"' opens an untracked inner array


NUMBERISH = [b"0", b"1", b"2", b"e", b".0", b"1.0", b",", b"]", b" "]
NUMBERISH += [b"0]", b"1]", b"2]", b"1,", b"1.0]", b"1e0]"]


def test_numbers_are_equal_by_value(tiny_vocab):
    inner = AllowAll(frozenset(ID[p] for p in NUMBERISH))
    matcher = guard({"type": "array", "uniqueItems": True}, tiny_vocab, inner)
    feed(matcher, b"[", b"1", b",")
    assert banned(matcher) - {PIECES[0]} >= {b"1]", b"1,", b"1.0]", b"1e0]"}
    assert {PIECES[t] for t in allowed(matcher)} == set(NUMBERISH) - {
        b"1]",
        b"1,",
        b"1.0]",
        b"1e0]",
    }
    feed(matcher, b"1")  # "1": ending it now repeats 1; "10", "11", "1.0..." may follow
    assert {PIECES[t] for t in allowed(matcher)} == set(NUMBERISH) - {b",", b"]", b" "}
    feed(matcher, b".0")  # "1.0" == 1, and so is "1.00"
    assert {PIECES[t] for t in allowed(matcher)} == set(NUMBERISH) - {b",", b"]", b" ", b"0]"}
    feed(matcher, b"1")  # "1.01" is new
    assert {PIECES[t] for t in allowed(matcher)} == set(NUMBERISH)


def test_literals_complete_without_a_structural_byte(tiny_vocab):
    matcher = guard({"type": "array", "uniqueItems": True}, tiny_vocab)
    feed(matcher, b"[", b"true", b",")
    # "tru" can only become true: a dead end, banned before it is taken.
    assert banned(matcher) == {b"true", b"true]", b'"a","a"', b"tru"}
    feed(matcher, b"tru")  # accept_token refuses duplicates only; the mask bans "e" then
    assert banned(matcher) == {b"e"}
    other = guard({"type": "array", "uniqueItems": True}, tiny_vocab)
    feed(other, b"[", b"1", b",")
    assert b"true" not in banned(other)  # true is not 1


def test_nested_tracked_arrays_by_properties_ref_and_additional_properties(tiny_vocab):
    schemas = [
        {"properties": {"tags": STRINGS, "other": {"type": "array"}}},
        {"$defs": {"a/b": STRINGS}, "properties": {"tags": {"$ref": "#/$defs/a~1b"}}},
        {"definitions": {"t": STRINGS}, "additionalProperties": {"$ref": "#/definitions/t"}},
        {"properties": {"other": {}}, "additionalProperties": STRINGS},
        {"patternProperties": {"^ta": STRINGS}, "additionalProperties": {"type": "array"}},
        {"allOf": [{"properties": {"tags": {"type": "array"}}}, {"properties": {"tags": STRINGS}}]},
        {"if": {"type": "object"}, "then": {"properties": {"tags": STRINGS}}},
    ]
    for schema in schemas:
        matcher = guard(schema, tiny_vocab)
        feed(matcher, b"{", b'"tags"', b":", b"[", b'"a"', b",")
        assert b'"a"]' in banned(matcher), schema
        if schema.get("definitions"):
            continue  # every member is tracked there
        untracked = guard(schema, tiny_vocab)
        feed(untracked, b"{", b'"other"', b":", b"[", b'"a"', b",")
        assert banned(untracked) == set(), schema


def test_a_recursive_schema_tracks_arrays_at_every_depth(tiny_vocab):
    node = {
        "type": "object",
        "properties": {"tags": STRINGS, "kids": {"type": "array", "items": {"$ref": "#"}}},
    }
    matcher = guard(node, tiny_vocab)
    feed(matcher, b"{", b'"kids"', b":", b"[", b"{", b'"kids"', b":", b"[", b"{", b'"tags"')
    feed(matcher, b":", b"[", b'"a"', b",")
    assert b'"a"]' in banned(matcher)
    feed(matcher, b'"b"', b"]", b"}", b"]", b"}", b",", b'"a"')  # kids items: objects
    assert banned(matcher) == set()


def test_an_untracked_array_allows_duplicates(tiny_vocab):
    schema = {"type": "array", "items": {"type": "array", "items": {"type": "string"}}}
    schema = {"anyOf": [schema, {"type": "object", "properties": {"tags": STRINGS}}]}
    matcher = guard(schema, tiny_vocab)
    feed(matcher, b"[", b"[", b'"a"', b",")
    assert banned(matcher) == set()


def test_array_items_are_never_compared(tiny_vocab):
    schema = {"type": "array", "items": {"type": "array"}, "uniqueItems": True}
    matcher = guard(schema, tiny_vocab)
    feed(matcher, b"[", b"[", b'"a"', b"]", b",", b"[", b'"a"')
    assert banned(matcher) == set()


def test_enum_items_exhausted_ban_a_new_item(tiny_vocab):
    schema = {"type": "array", "items": {"enum": ["a", "b"]}, "uniqueItems": True}
    matcher = guard(schema, tiny_vocab)
    feed(matcher, b"[", b'"a"', b",")
    # '"a' can only become "a": a dead end; '"' may still become "b".
    dups = {b'"a"', b'"a",', b'"a"]', b'"a","a"', b'"\\u0061"', b' "a"'}
    assert banned(matcher) == dups | {b'"a'}
    feed(matcher, b'"b"')
    assert banned(matcher) == {b","}


def test_enum_prefix_of_an_unseen_value_stays_allowed(tiny_vocab):
    schema = {"type": "array", "items": {"enum": ["a", "ab"]}, "uniqueItems": True}
    matcher = guard(schema, tiny_vocab)
    feed(matcher, b"[", b'"a"', b",")
    assert b'"a' not in banned(matcher)  # may become "ab"
    feed(matcher, b'"ab')
    assert b'"' not in banned(matcher)


def test_booleans_run_out_after_two(tiny_vocab):
    schema = {"type": "array", "items": {"type": "boolean"}, "uniqueItems": True}
    matcher = guard(schema, tiny_vocab)
    feed(matcher, b"[", b"true", b",", b"false")
    assert banned(matcher) == {b","}


class OneLetterStrings(AllowAll):
    """A grammar of arrays of one-letter strings (maxLength 1), as far as the guard can
    tell: once a string holds a letter, only a closing quote may follow."""

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        text = b"".join(PIECES[t] or b"" for t in self.accepted)
        self.allowed = EVERY
        if text.count(b'"') % 2 and not text.endswith(b'"'):
            self.allowed = frozenset(ID[p] for p in (b'"', b'"]', b'","', b'"a"'))
        super().fill_bitmask(bitmask, row)


def test_a_token_after_which_only_a_duplicate_can_follow_is_banned(tiny_vocab):
    inner = OneLetterStrings()
    matcher = guard(STRINGS, tiny_vocab, inner)
    feed(matcher, b"[", b'"a"', b",")
    # '"a' leaves "a" open, and only its closing quote may follow: a dead end.
    assert banned(matcher) == {b'"a"', b'"a",', b'"a"]', b'"a","a"', b'"\\u0061"', b' "a"', b'"a'}
    assert inner.accepted == [ID[b"["], ID[b'"a"'], ID[b","]]  # the lookahead rolled back
    feed(matcher, b'"')
    assert banned(matcher) == {b'a"', b'a",', b'a"]', b'\\u0061"', b"a"}


def test_rollback_restores_the_items_seen(tiny_vocab):
    inner = AllowAll()
    matcher = guard(STRINGS, tiny_vocab, inner)
    feed(matcher, b"[", b'"a"', b",", b'"b"', b",")
    assert {b'"a"', b'"b"'} <= banned(matcher)
    matcher.rollback(3)
    assert inner.accepted == [ID[b"["], ID[b'"a"']]
    assert banned(matcher) == set()  # after '"a"' nothing can complete an item
    feed(matcher, b",")
    assert banned(matcher) == {b'"a"', b'"a",', b'"a"]', b'"a","a"', b'"\\u0061"', b' "a"'}


def test_a_duplicate_is_refused_by_accept_token(tiny_vocab):
    inner = AllowAll()
    matcher = guard(STRINGS, tiny_vocab, inner)
    feed(matcher, b"[", b'"a"', b",")
    assert not matcher.accept_token(ID[b'"a"]'])
    assert len(inner.accepted) == 3
    assert matcher.accept_token(ID[b'"b"'])


def test_forced_string_is_withheld_inside_tracked_arrays(tiny_vocab):
    schema = {"properties": {"tags": STRINGS, "other": {"type": "array"}}}
    matcher = guard(schema, tiny_vocab, AllowAll(forced='"x"'))
    assert matcher.forced_string() == '"x"'
    feed(matcher, b"{", b'"tags"', b":", b"[")
    assert matcher.forced_string() == ""
    feed(matcher, b"{")  # an object inside a tracked array: still inside it
    assert matcher.forced_string() == ""
    feed(matcher, b"}", b"]", b",", b'"other"', b":", b"[")
    assert matcher.forced_string() == '"x"'


def test_only_the_grammar_allowed_tokens_are_judged(tiny_vocab):
    inner = AllowAll(frozenset({ID[b'"b"'], ID[b'"a"]']}))
    matcher = guard(STRINGS, tiny_vocab, inner)
    feed(matcher, b"[", b'"a"', b",")
    assert allowed(matcher) == {ID[b'"b"']}


def test_the_token_tables_agree_with_simulating_every_token(tiny_vocab):
    """Every state reached by a few prefixes: the mask equals the one from feeding each
    token to a fresh guard (accept_token simulates it in full), less the tokens leaving a
    literal that can only repeat."""
    prefixes = [
        [b"[", b'"a"', b",", b'"', b"a"],
        [b"[", b'"a"', b",", b" ", b'"b"', b" ", b",", b" "],
        [b"{", b'"tags"', b":", b"[", b'"ab', b'"', b",", b'"a'],
        [b"[", b"1", b",", b"2", b",", b"true", b",", b'"\\u0061"', b",", b'"'],
    ]
    schema = {"properties": {"tags": STRINGS}, "type": ["object", "array"], "uniqueItems": True}
    for prefix in prefixes:
        for n in range(len(prefix) + 1):
            matcher = guard(schema, tiny_vocab)
            feed(matcher, *prefix[:n])
            expected = set()
            for token in EVERY:
                fresh = guard(schema, tiny_vocab)
                feed(fresh, *prefix[:n])
                if fresh.accept_token(token) and not fresh._tracker.dead_partial():
                    expected.add(token)
            assert allowed(matcher) == expected, (prefix[:n], banned(matcher))


# ----------------------------------------------------------------- llguidance, end to end


def _greedy_lowest(matcher, vocab, max_tokens: int = 200) -> bytes:
    """Generates by always taking the lowest allowed token id, until EOS."""
    out = b""
    for _ in range(max_tokens):
        ids = allowed(matcher, vocab.vocab_size)
        assert ids, f"dead end after {out!r}"
        token = min(ids)
        if token in vocab.eos_token_ids:
            return out
        assert matcher.accept_token(token)
        out += vocab.token_bytes[token]
    raise AssertionError(f"no EOS after {out!r}")


@pytest.mark.parametrize(
    "items, min_items",
    [
        ({"enum": ["red", "green", "blue"]}, 3),
        ({"type": "integer", "minimum": 0, "maximum": 99}, 4),
        ({"type": "string", "maxLength": 2}, 4),
        ({"type": "boolean"}, 2),
    ],
)
def test_llguidance_lowest_token_generation_has_unique_items(vocab, model_vocab, items, min_items):
    from radixlm.runtime.config import GrammarConfig
    from radixlm.runtime.constrained.llguidance_backend import LLGuidanceBackend
    from radixlm.runtime.constrained.spec import GrammarSpec

    schema = {"type": "array", "items": items, "minItems": min_items, "maxItems": min_items}
    backend = LLGuidanceBackend(vocab, GrammarConfig())
    unguarded = backend.compile(GrammarSpec("json_schema", json.dumps(schema))).new_matcher()
    plain = json.loads(_greedy_lowest(unguarded, vocab))
    assert len(set(map(json.dumps, plain))) < len(plain)  # the backend alone repeats

    inner = backend.compile(GrammarSpec("json_schema", json.dumps(schema))).new_matcher()
    plan = UniquePlan.from_schema(schema | {"uniqueItems": True})
    matcher = UniqueItemsMatcher(inner, plan, model_vocab)
    out = json.loads(_greedy_lowest(matcher, vocab))
    assert len(out) == min_items and len(set(map(json.dumps, out))) == min_items, out


def test_llguidance_backend_enforces_unique_items_of_a_schema(compiler, hf_tokenizer):
    """Through the compiler and its worker: the schema's uniqueItems is kept out of
    llguidance's grammar and enforced by the guard around each matcher."""
    from radixlm.runtime.constrained import GrammarSpec
    from tests.runtime.constrained.conftest import accepts_text

    schema = {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
        "required": ["tags"],
    }
    compiled = compiler.compile(GrammarSpec("json_schema", json.dumps(schema)), "llguidance")
    assert compiled.unique is not None
    assert accepts_text(compiled, hf_tokenizer, '{"tags":["a","b"]}')
    assert not accepts_text(compiled, hf_tokenizer, '{"tags":["a","a"]}')


def test_unique_object_items_are_refused_by_name(compiler):
    from radixlm.runtime.constrained import GrammarSpec
    from radixlm.runtime.errors import UnsupportedGrammarError

    schema = {"type": "array", "items": {"type": "object"}, "uniqueItems": True}
    with pytest.raises(
        UnsupportedGrammarError, match="uniqueItems at # .*every item is a string, number"
    ):
        compiler.compile(GrammarSpec("json_schema", json.dumps(schema)), "llguidance")
