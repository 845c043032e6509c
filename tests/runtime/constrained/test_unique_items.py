"""UniqueItemsMatcher: uniqueItems enforced on a backend's mask, over a tiny hand-built
vocabulary (a fake inner matcher allows every token, so each ban the guard adds shows),
then end to end on llguidance over the default model's vocabulary."""

from __future__ import annotations

import json
import pickle
import random

import jsonschema
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


ANY = {"type": "array", "uniqueItems": True}  # items of every kind


def closing(pieces: set[bytes]) -> bool:
    return all(b"]" in p or b"}" in p for p in pieces)


def test_object_items_equal_in_any_key_order_are_banned_at_the_closing_token(tiny_vocab):
    matcher = guard(ANY, tiny_vocab)
    feed(matcher, b"[", b"{", b'"tags"', b":", b"1", b",", b'"kids"', b":", b"2", b"}", b",")
    feed(matcher, b"{", b'"kids"', b":", b"2", b",", b'"tags"', b":", b"1")
    assert b"}" in banned(matcher) and closing(banned(matcher))
    feed(matcher, b".0")  # 1.0 == 1
    assert b"}" in banned(matcher) and closing(banned(matcher))
    feed(matcher, b"1")  # 1.01 is new
    assert banned(matcher) == set()


def test_unequal_object_items_are_allowed(tiny_vocab):
    for second in [(b"2",), (b"1", b",", b'"kids"', b":", b"1"), (b"true",), (b'"a"',)]:
        matcher = guard(ANY, tiny_vocab)
        feed(matcher, b"[", b"{", b'"tags"', b":", b"1", b"}", b",", b"{", b'"tags"', b":")
        feed(matcher, *second)
        assert b"}" not in banned(matcher), second  # true is not 1


def test_strings_inside_items_are_equal_by_decoded_value(tiny_vocab):
    matcher = guard(ANY, tiny_vocab)
    feed(matcher, b"[", b"{", b'"tags"', b":", b'"a"', b"}", b",", b"{", b'"tags"', b":")
    feed(matcher, b'"\\u0061"')
    assert b"}" in banned(matcher)


def test_array_items_are_compared_elementwise_at_their_depth(tiny_vocab):
    matcher = guard(ANY, tiny_vocab)
    feed(matcher, b"[", b"[", b"1", b",", b"[", b"true", b"]", b"]", b",")
    feed(matcher, b"[", b"1.0", b",", b"[", b"true")
    assert banned(matcher) == set()  # "]" closes [true], not the item
    feed(matcher, b"]")
    assert b"]" in banned(matcher) and closing(banned(matcher))
    other = guard(ANY, tiny_vocab)
    feed(other, b"[", b"[", b"1", b"]", b",", b"[", b"true")
    assert banned(other) == set()  # [true] is not [1]
    mid_token = guard(ANY, tiny_vocab)
    feed(mid_token, b"[", b"[", b"1", b"]", b",", b"[")
    assert {b"1]", b"1.0]", b"1e0]"} <= banned(mid_token)  # the number, then the item


def test_a_duplicate_object_is_refused_by_accept_token_and_rolled_back(tiny_vocab):
    inner = AllowAll()
    matcher = guard(ANY, tiny_vocab, inner)
    feed(matcher, b"[", b"{", b"}", b",", b"{")
    assert not matcher.accept_token(ID[b"}"])
    feed(matcher, b'"tags"', b":", b"1", b"}", b",", b"{")
    assert banned(matcher) >= {b"}"}
    matcher.rollback(4)  # back to '[{},{"tags":'
    feed(matcher, b"2", b"}", b",", b"{", b'"tags"', b":", b"2")
    assert b"}" in banned(matcher)


def _spelled(value, rng: random.Random) -> str:
    """``value`` as JSON text, spelled one of several ways: 1 as 1, 1.0 or 1e0, "a" as
    "a" or "\\u0061", members in a random order, spaces here and there."""
    space = rng.choice(["", " "])
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return rng.choice([json.dumps(value), f"{float(value)!r}", f"{value}e0"])
    if isinstance(value, str):
        return rng.choice([json.dumps(value), json.dumps(value).replace("a", "\\u0061")])
    if isinstance(value, list):
        return "[" + f",{space}".join(_spelled(v, rng) for v in value) + "]"
    members = list(value.items())
    rng.shuffle(members)
    return "{" + ",".join(f"{json.dumps(k)}:{space}{_spelled(v, rng)}" for k, v in members) + "}"


def _random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(3 if depth < 2 else 1)
    if kind == 0:
        return rng.choice([0, 1, -1, 2.5, True, False, None, "a", "b", ""])
    if kind == 1:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(3))]
    return {k: _random_value(rng, depth + 1) for k in rng.sample("ab", rng.randrange(3))}


def test_items_of_every_kind_are_compared_as_jsonschema_compares_them():
    """Random arrays, fed a byte at a time: the guard refuses the byte completing an item
    exactly when jsonschema finds the array's items not unique."""
    byte_vocab = UniqueItemsVocab([bytes([b]) for b in range(256)], 256)
    validator = jsonschema.Draft202012Validator(ANY)
    rng = random.Random(0)
    num_duplicates = 0
    for _ in range(600):
        array = [_random_value(rng) for _ in range(rng.randrange(2, 5))]
        text = "[" + ",".join(_spelled(v, rng) for v in array) + "]"
        matcher = guard(ANY, byte_vocab)
        accepted = all(matcher.accept_token(b) for b in text.encode())
        assert accepted == validator.is_valid(json.loads(text)), text
        num_duplicates += not accepted
    assert 50 < num_duplicates < 550


def test_object_enum_items_exhausted_ban_a_new_item(tiny_vocab):
    schema = {"type": "array", "items": {"enum": [{"tags": 1}, [True]]}, "uniqueItems": True}
    matcher = guard(schema, tiny_vocab)
    feed(matcher, b"[", b"{", b'"tags"', b":", b"1.0", b"}", b",", b"[", b"true", b"]")
    assert b"," in banned(matcher)


def test_items_nested_in_items_are_tracked_on_their_own(tiny_vocab):
    schema = {"type": "array", "uniqueItems": True, "items": STRINGS}
    matcher = guard(schema, tiny_vocab)
    feed(matcher, b"[", b"[", b'"a"', b",")
    assert b'"a"]' in banned(matcher)  # the inner array's own duplicate
    feed(matcher, b'"b"', b"]", b",", b"[", b'"a"', b",", b'"b"')
    assert b"]" in banned(matcher)  # ["a","b"] again


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


def test_llguidance_a_digit_after_which_only_a_duplicate_can_follow_is_banned_in_an_object(
    vocab, model_vocab
):
    """An array that is an object's member: the key read before it does not keep the
    one-token lookahead from a number's next digit (after "-", "1" is banned: -1 seen)."""
    digits = {"type": "array", "items": {"type": "integer", "minimum": -9, "maximum": -1},
              "uniqueItems": True, "minItems": 3, "maxItems": 3}  # fmt: skip
    schema = {"type": "object", "properties": {"n": digits}, "required": ["n"]}
    plain = {**schema, "properties": {"n": {**digits, "uniqueItems": False}}}
    inner = _llguidance_matcher(vocab, plain)
    matcher = UniqueItemsMatcher(inner, UniquePlan.from_schema(schema), model_vocab)
    assert json.loads(_greedy_lowest(matcher, vocab)) == {"n": [-1, -2, -3]}


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


def test_llguidance_backend_enforces_unique_object_items(compiler, hf_tokenizer):
    from radixlm.runtime.constrained import GrammarSpec
    from tests.runtime.constrained.conftest import accepts_text

    schema = {"type": "array", "items": {"type": ["object", "array", "integer", "boolean"]},
              "uniqueItems": True}  # fmt: skip
    for lenient in (False, True):
        spec = GrammarSpec("json_schema", json.dumps(schema), lenient=lenient)
        compiled = compiler.compile(spec, "llguidance")
        assert compiled.unique is not None and not compiled.warnings
        assert accepts_text(compiled, hf_tokenizer, '[{"a":1,"b":[2]},{"a":1,"b":[3]},[1],[true]]')
        assert not accepts_text(compiled, hf_tokenizer, '[{"a":1,"b":[2]},{"b":[2.0],"a":1}]')
        assert not accepts_text(compiled, hf_tokenizer, "[[1,[true]],2,[1,[true]]]")


def _closed(**properties) -> dict:
    return {"type": "object", "properties": properties, "required": sorted(properties),
            "additionalProperties": False}  # fmt: skip


@pytest.mark.parametrize(
    "items, num_items",
    [
        (_closed(a={"enum": [1, 2, 3]}), 3),  # after {"a":1 only "}": 1 is banned
        (_closed(n={"type": "integer", "minimum": 0, "maximum": 1}, b={"type": "boolean"}), 2),
        (_closed(s={"type": "string", "maxLength": 1}), 4),  # the closing quote is banned
        (_closed(k={"enum": ["ab", "cd"]}, s={"enum": ["xy", "zw", "xq"]}), 3),
        (_closed(p={"type": "array", "items": {"type": "boolean"}, "maxItems": 1}), 3),
        ({"type": "array", "items": {"enum": [0, 1]}, "minItems": 1, "maxItems": 1}, 2),
    ],
)
def test_llguidance_lowest_token_object_items_are_unique_without_dead_ends(
    vocab, model_vocab, items, num_items
):
    """Each foreseen dead end (a token after which only a duplicate's closing bracket
    could follow) is banned one to four tokens ahead, so the lowest-token walk, which
    repeats its first item without the guard, ends with distinct items."""
    schema = {"type": "array", "items": items, "minItems": num_items, "maxItems": num_items}
    plain = json.loads(_greedy_lowest(_llguidance_matcher(vocab, schema), vocab))
    assert len({json.dumps(v, sort_keys=True) for v in plain}) < len(plain)
    matcher = _guarded(vocab, model_vocab, schema)
    out = json.loads(_greedy_lowest(matcher, vocab))
    assert len(out) == num_items
    jsonschema.validate(out, schema | {"uniqueItems": True})


def test_an_unforeseen_dead_end_leaves_an_empty_mask(vocab, model_vocab):
    """Both booleans used with n=0: the choice of n was the last chance, and the guard
    does not look back that far; the mask is empty (the engine aborts the request)."""
    items = _closed(n={"type": "integer", "minimum": 0, "maximum": 1}, b={"type": "boolean"})
    schema = {"type": "array", "items": items, "minItems": 4, "maxItems": 4}
    matcher = _guarded(vocab, model_vocab, schema)
    for token in _tokens(vocab, '[{"n":0,"b":false},{"n":0,"b":true},{"n":'):
        assert matcher.accept_token(token)
    assert {vocab.token_bytes[t] for t in allowed(matcher, vocab.vocab_size)} == {b"0", b"1"}
    for token in _tokens(vocab, '0,"b":'):
        assert matcher.accept_token(token)
    assert allowed(matcher, vocab.vocab_size) == set()  # true and false: both seen


# A small schema of items of every kind; strings of one character keep every item open
# to a new value, so no dead end is out of the guard's sight (a negative zero would be:
# after -0, "0" is not a spelling the lookahead tries).
RANDOM_SCHEMA = {
    "type": "array",
    "maxItems": 5,
    "items": {
        "anyOf": [
            {"type": "object", "properties": {"k": {"enum": [1, 2]},
             "s": {"type": "string", "maxLength": 1}}, "additionalProperties": False},
            {"type": "array", "items": {"type": "string", "maxLength": 1}, "maxItems": 2},
            {"type": "integer", "minimum": 0},
            {"type": "boolean"},
        ]
    },
}  # fmt: skip


def test_random_token_paths_complete_only_valid_outputs(vocab, model_vocab):
    """Random walks through the guarded llguidance matcher, each step the lowest allowed
    token (which repeats items) or, one step in three, a random one: every walk ends,
    without a dead end, in an output jsonschema finds valid, and the guard had to ban."""
    rng = random.Random(0)
    validator = jsonschema.Draft202012Validator(RANDOM_SCHEMA | {"uniqueItems": True})
    num_banning = 0
    for _ in range(40):
        matcher = _guarded(vocab, model_vocab, RANDOM_SCHEMA)
        plain = _llguidance_matcher(vocab, RANDOM_SCHEMA)
        out, banning = b"", False
        for _ in range(200):
            ids = allowed(matcher, vocab.vocab_size)
            assert ids, f"dead end after {out!r}"
            banning |= ids != allowed(plain, vocab.vocab_size)
            token = min(ids) if rng.random() < 2 / 3 else rng.choice(sorted(ids))
            if token in vocab.eos_token_ids:
                break
            assert matcher.accept_token(token) and plain.accept_token(token)
            out += vocab.token_bytes[token]
        else:
            raise AssertionError(f"no EOS after {out!r}")
        assert validator.is_valid(json.loads(out)), out
        num_banning += banning
    assert num_banning >= 10


def _llguidance_matcher(vocab, schema: dict):
    from radixlm.runtime.config import GrammarConfig
    from radixlm.runtime.constrained.llguidance_backend import LLGuidanceBackend
    from radixlm.runtime.constrained.spec import GrammarSpec

    backend = LLGuidanceBackend(vocab, GrammarConfig())
    return backend.compile(GrammarSpec("json_schema", json.dumps(schema))).new_matcher()


def _guarded(vocab, model_vocab, schema: dict) -> UniqueItemsMatcher:
    plan = UniquePlan.from_schema(schema | {"uniqueItems": True})
    return UniqueItemsMatcher(_llguidance_matcher(vocab, schema), plan, model_vocab)


def _tokens(vocab, text: str) -> list[int]:
    """``text`` spelled greedily with the longest tokens of the vocabulary."""
    ids_by_bytes = {piece: t for t, piece in enumerate(vocab.token_bytes) if piece}
    data, out = text.encode(), []
    while data:
        n = max(n for n in range(1, len(data) + 1) if data[:n] in ids_by_bytes)
        out.append(ids_by_bytes[data[:n]])
        data = data[n:]
    return out
