"""SamplingParams: SGLang-style dicts in, every bad value named in the error."""

from __future__ import annotations

import json
import math

import pytest

from radixlm.runtime.errors import ConstraintConflictError, InvalidSamplingParamsError
from radixlm.runtime.io.sampling_params import SamplingParams

BAD_VALUES = [
    # wrong types
    ("max_new_tokens", "16"),
    ("max_new_tokens", 16.0),
    ("max_new_tokens", True),
    ("temperature", "0.5"),
    ("temperature", True),
    ("top_p", [0.9]),
    ("top_k", 5.0),
    ("min_p", False),
    ("repetition_penalty", "1.1"),
    ("presence_penalty", "0"),
    ("stop", 3),
    ("stop", ["ok", 3]),
    ("stop_token_ids", 2),
    ("stop_token_ids", [1, "2"]),
    ("stop_token_ids", [True]),
    ("ignore_eos", 1),
    ("skip_special_tokens", "yes"),
    ("no_stop_trim", 0),
    ("seed", 1.5),
    ("seed", "7"),
    ("n", 2.0),
    # not finite
    ("temperature", math.nan),
    ("temperature", math.inf),
    ("top_p", math.nan),
    ("min_p", math.nan),
    ("repetition_penalty", math.inf),
    ("frequency_penalty", -math.inf),
    ("presence_penalty", math.nan),
    # out of range
    ("max_new_tokens", -1),
    ("min_new_tokens", -1),
    ("temperature", -0.1),
    ("top_p", 0.0),
    ("top_p", 1.01),
    ("top_k", 0),
    ("top_k", -2),
    ("min_p", -0.01),
    ("min_p", 1.5),
    ("repetition_penalty", 0.0),
    ("repetition_penalty", -1.0),
    ("frequency_penalty", 2.01),
    ("frequency_penalty", -2.5),
    ("presence_penalty", 3),
    ("stop", ""),
    ("stop", ["ok", ""]),
    ("stop_token_ids", [-1]),
    ("n", 0),
]


@pytest.mark.parametrize(("field", "value"), BAD_VALUES)
def test_bad_value_raises_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(InvalidSamplingParamsError) as info:
        SamplingParams.from_dict({field: value})
    assert info.value.field == field
    assert field in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("field", ["min_new_tokens", "frequency_penalty", "stop", "stop_regex"])
def test_a_null_in_a_dict_means_the_default(field: str) -> None:
    """SGLang's clients send nulls (``"stop_regex": null``); the constructor still refuses."""
    assert SamplingParams.from_dict({field: None}) == SamplingParams()
    if field in ("min_new_tokens", "frequency_penalty"):
        with pytest.raises(InvalidSamplingParamsError):
            SamplingParams(**{field: None})


def test_stop_regex_is_normalised_like_stop() -> None:
    assert SamplingParams(stop_regex=r"\d+").stop_regex == (r"\d+",)
    assert SamplingParams.from_dict({"stop_regex": []}).stop_regex == ()
    assert SamplingParams(stop_regex=["a", "b"]).to_dict()["stop_regex"] == ["a", "b"]
    with pytest.raises(InvalidSamplingParamsError) as info:
        SamplingParams(stop_regex=[""])
    assert info.value.field == "stop_regex"


@pytest.mark.parametrize("key", ["max_tokens", "topp", "grammar", "response_format"])
def test_unknown_key_is_named(key: str) -> None:
    with pytest.raises(InvalidSamplingParamsError) as info:
        SamplingParams.from_dict({"temperature": 0, key: "x"})
    assert info.value.field == key
    assert repr(key) in str(info.value)


def test_min_new_tokens_above_max_new_tokens() -> None:
    with pytest.raises(InvalidSamplingParamsError) as info:
        SamplingParams(max_new_tokens=4, min_new_tokens=5)
    assert info.value.field == "min_new_tokens"


def test_defaults_follow_sglang() -> None:
    params = SamplingParams.from_dict(None)
    assert params == SamplingParams.from_dict({})
    assert (params.max_new_tokens, params.temperature, params.top_p, params.top_k) == (
        128,
        1.0,
        1.0,
        -1,
    )
    assert params.stop == () and params.stop_token_ids == () and params.seed is None
    assert params.skip_special_tokens and not params.ignore_eos and not params.no_stop_trim


VALID_DICTS = [
    {"temperature": 0, "max_new_tokens": 16},
    {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 1234},
    {"max_new_tokens": 0},
    {"stop": "\n", "stop_token_ids": [2, 7], "ignore_eos": True, "no_stop_trim": True},
    {"stop": ["User:", "###"], "min_new_tokens": 3, "n": 4},
    {"repetition_penalty": 1.3, "frequency_penalty": -2, "presence_penalty": 2.0},
    {"skip_special_tokens": False, "spaces_between_special_tokens": False, "seed": -5},
    {"stop": None, "stop_token_ids": None, "seed": None},
]


@pytest.mark.parametrize("params", VALID_DICTS)
def test_valid_dicts_round_trip(params: dict) -> None:
    parsed = SamplingParams.from_dict(params)
    as_dict = parsed.to_dict()
    assert SamplingParams.from_dict(json.loads(json.dumps(as_dict))) == parsed
    for key, value in params.items():
        if isinstance(value, (int, float, list)):  # str / None are normalised (next test)
            assert as_dict[key] == value, key


def test_sequences_become_tuples_and_numbers_plain_types() -> None:
    params = SamplingParams.from_dict({"stop": "x", "stop_token_ids": [3], "temperature": 0})
    assert params.stop == ("x",)
    assert params.stop_token_ids == (3,)
    assert isinstance(params.temperature, float)
    assert SamplingParams(stop=None).stop == ()


def test_params_are_frozen_and_hashable() -> None:
    params = SamplingParams(stop=["a"])
    with pytest.raises(AttributeError):
        params.temperature = 0.5  # type: ignore[misc]
    assert hash(params) == hash(SamplingParams(stop=("a",)))


@pytest.mark.parametrize(
    ("params", "greedy"),
    [({"temperature": 0}, True), ({"top_k": 1}, True), ({}, False), ({"temperature": 0.1}, False)],
)
def test_is_greedy(params: dict, greedy: bool) -> None:
    assert SamplingParams.from_dict(params).is_greedy is greedy


def test_validate_for_model_names_the_bad_stop_token_id() -> None:
    """Only the stop token ids: whether the prompt fits is ContextRoom's rule."""
    params = SamplingParams(max_new_tokens=10**6, stop_token_ids=[5, 99])
    assert params.validate_for_model(vocab_size=100) is None
    with pytest.raises(InvalidSamplingParamsError) as info:
        params.validate_for_model(vocab_size=99)
    assert info.value.field == "stop_token_ids"
    assert str(info.value) == "sampling parameter 'stop_token_ids': token id 99 is outside [0, 99)"


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"regex": "a", "json_schema": {}}, "json_schema"),
        ({"regex": ""}, "regex"),
        ({"ebnf": 3}, "ebnf"),
        ({"json_schema": "[1, 2]"}, "json_schema"),
        ({"json_schema": "{broken"}, "json_schema"),
        ({"choices": "yes"}, "choices"),
        ({"choices": ["a", "a"]}, "choices"),
        ({"choices": ["a", ""]}, "choices"),
        ({"grammar_backend": "outlines-core"}, "grammar_backend"),
        ({"jump_forward": 1}, "jump_forward"),
        ({"json_max_whitespace": -1}, "json_max_whitespace"),
        ({"json_max_whitespace": 100}, "json_max_whitespace"),
        ({"json_schema": {}, "json_bounded_numbers": 0}, "json_bounded_numbers"),
        ({"json_bounded_numbers": "no"}, "json_bounded_numbers"),
        ({"json_max_string_length": -1}, "json_max_string_length"),
        ({"json_max_string_length": 16_385}, "json_max_string_length"),
        ({"json_max_string_length": True}, "json_max_string_length"),
    ],
)
def test_bad_constraint_params_name_the_field(params: dict, field: str) -> None:
    with pytest.raises(InvalidSamplingParamsError) as info:
        SamplingParams.from_dict(params)
    assert info.value.field == field


def test_two_constraints_are_refused_by_the_one_rule() -> None:
    """The rule is constrained.spec's (the HTTP routes apply it too); the second in
    GRAMMAR_KINDS' order is named."""
    with pytest.raises(ConstraintConflictError) as info:
        SamplingParams(choices=["x"], lark="start: 'a'", regex="a")
    assert (info.value.field, info.value.first) == ("lark", "regex")
    assert str(info.value) == (
        "sampling parameter 'lark': lark cannot be combined with regex: "
        "a request takes one output constraint"
    )


def test_constraint_params_normalise_to_a_hashable_spec() -> None:
    schema = {"type": "object", "properties": {"b": {}, "a": {}}}
    from_dict = SamplingParams(json_schema=schema)
    from_text = SamplingParams(json_schema='{"type": "object", "properties": {"b": {}, "a": {}}}')
    assert from_dict == from_text and hash(from_dict) == hash(from_text)
    assert from_dict.grammar.text == '{"type":"object","properties":{"b":{},"a":{}}}'  # order kept
    choices = SamplingParams(choices=["yes", "no"])
    assert choices.choices == ("yes", "no") and choices.grammar.choices == ("yes", "no")
    assert SamplingParams.from_dict(choices.to_dict()) == choices
    assert SamplingParams().grammar is None


def test_json_bounded_numbers_is_part_of_the_json_spec() -> None:
    """None leaves it to the engine; either choice is in the spec (the compile cache key)."""
    tag = {"type": "structural_tag", "format": {"type": "const_string", "value": "hi"}}
    for constraint in ({"json_schema": {"type": "integer"}}, {"structural_tag": tag}):
        assert SamplingParams(**constraint).grammar.bounded_numbers is None
        off = SamplingParams(**constraint, json_bounded_numbers=False).grammar
        on = SamplingParams(**constraint, json_bounded_numbers=True).grammar
        assert (off.bounded_numbers, on.bounded_numbers) == (False, True) and off != on
    assert SamplingParams(regex="a", json_bounded_numbers=False).grammar.bounded_numbers is None


def test_json_max_string_length_is_part_of_the_json_spec() -> None:
    """None leaves it to the engine; 0 (off) and a length are each in the spec."""
    tag = {"type": "structural_tag", "format": {"type": "const_string", "value": "hi"}}
    for constraint in ({"json_schema": {"type": "string"}}, {"structural_tag": tag}):
        assert SamplingParams(**constraint).grammar.max_string_length is None
        off = SamplingParams(**constraint, json_max_string_length=0).grammar
        on = SamplingParams(**constraint, json_max_string_length=40).grammar
        assert (off.string_bound, on.string_bound) == (None, 40) and off != on


def test_structural_tag_is_one_more_constraint() -> None:
    tag = {"type": "structural_tag", "format": {"type": "const_string", "value": "hi"}}
    params = SamplingParams(structural_tag=tag)
    assert params.grammar.kind == "structural_tag"
    assert params.grammar.default_backend == "xgrammar"
    assert params == SamplingParams(structural_tag=json.dumps(tag))
    with pytest.raises(InvalidSamplingParamsError) as info:
        SamplingParams(regex="a", structural_tag=tag)
    assert info.value.field == "structural_tag"
    with pytest.raises(InvalidSamplingParamsError) as info:
        SamplingParams(structural_tag="{not json")
    assert info.value.field == "structural_tag"


def test_a_sample_reads_no_schema_again(monkeypatch) -> None:
    """n samples share the schema read once when the parameters were made."""
    from radixlm.runtime.io import request_builder, sampling_params

    params = SamplingParams(json_schema={"type": "object"}, n=3, seed=7)
    alone = SamplingParams(json_schema={"type": "object"})

    def read_again(*args, **kwargs):
        raise AssertionError("the schema was read again")

    monkeypatch.setattr(sampling_params, "schema_text", read_again)
    samples = list(request_builder.RequestBuilder.expand_samples(params))
    assert [(s.n, s.seed) for s in samples] == [(1, 7), (1, 8), (1, 9)]
    assert all(s.json_schema is params.json_schema for s in samples)
    assert samples[0].grammar == alone.grammar
