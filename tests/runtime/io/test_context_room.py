"""ContextRoom: the context-fit rule, its one message, as the engine and the routes use it."""

from __future__ import annotations

import pytest

from radixlm.runtime.errors import ContextLengthError, InvalidRequestError
from radixlm.runtime.io.context_room import ContextRoom

CONTEXT = "this model's context holds 64 (prompt plus output)"


def test_the_fewest_of_context_and_pool_bounds_a_request():
    assert ContextRoom(64).max_total_tokens == 64
    assert ContextRoom(64, kv_capacity=100).max_total_tokens == 64
    assert ContextRoom(64, kv_capacity=40).max_total_tokens == 40


def test_what_fits_exactly_passes_and_one_token_more_is_refused():
    room = ContextRoom(64)
    assert room.num_new_tokens(54, 10) == 10
    assert room.num_new_tokens(64, 0) == 0  # scoring the prompt only
    with pytest.raises(ContextLengthError) as info:
        room.num_new_tokens(55, 10)
    assert isinstance(info.value, InvalidRequestError) and info.value.field == "max_new_tokens"
    assert str(info.value) == (
        f"the prompt has 55 tokens + 10 new tokens (max_new_tokens); {CONTEXT}"
    )


def test_none_asks_for_all_the_room_left_which_must_be_a_token():
    room = ContextRoom(64)
    assert room.num_new_tokens(20, None, "max_tokens") == 44
    assert room.num_new_tokens(63, None, "max_tokens") == 1
    with pytest.raises(ContextLengthError) as info:  # the prompt alone fills the context
        room.num_new_tokens(64, None, "max_tokens")
    assert info.value.field == "max_tokens"
    assert str(info.value) == f"the prompt has 64 tokens; {CONTEXT}"


def test_a_lower_bound_on_the_prompt_says_at_least():
    with pytest.raises(ContextLengthError) as info:
        ContextRoom(64).num_new_tokens(60, 8, "max_completion_tokens", at_least=True)
    assert info.value.field == "max_completion_tokens"
    assert str(info.value) == (
        f"the prompt has at least 60 tokens + 8 new tokens (max_completion_tokens); {CONTEXT}"
    )


def test_a_smaller_pool_is_named_with_its_option():
    with pytest.raises(ContextLengthError) as info:
        ContextRoom(64, kv_capacity=40).num_new_tokens(30, 20)
    assert str(info.value) == (
        "the prompt has 30 tokens + 20 new tokens (max_new_tokens); the KV pool holds 40 "
        "(prompt plus output; raise max_total_tokens)"
    )
