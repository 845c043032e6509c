"""The per-request cost limits, without a model: each past its bound is a
RequestLimitError naming the field and the option."""

from __future__ import annotations

import pytest

from radixlm.runtime.config import ConfigError, EngineConfig, LimitsConfig
from radixlm.runtime.errors import InvalidRequestError, RequestLimitError
from radixlm.runtime.io.limits import (
    check_json_depth,
    check_logprob_entries,
    check_request,
    logprob_entries,
)
from radixlm.runtime.io.messages import GenerateRequest, LogprobSpec
from radixlm.runtime.io.sampling_params import SamplingParams

LIMITS = LimitsConfig(max_stop_string_chars=10, max_stop_chars=15, max_json_depth=3)


def request(**params) -> GenerateRequest:
    top = params.pop("top_logprobs_num", None)
    return GenerateRequest(text="x", sampling_params=SamplingParams(**params), top_logprobs_num=top)


def refusal(req: GenerateRequest) -> RequestLimitError:
    with pytest.raises(RequestLimitError) as info:
        check_request(req, LIMITS)
    assert isinstance(info.value, InvalidRequestError)
    return info.value


def test_stop_strings_within_both_caps_pass():
    check_request(request(stop=["a" * 10, "b" * 5]), LIMITS)


def test_one_stop_string_too_long():
    error = refusal(request(stop=["a" * 11]))
    assert (error.field, error.limit) == ("stop", "max_stop_string_chars")
    assert "11 characters" in str(error)


def test_stop_strings_too_long_together():
    error = refusal(request(stop=["a" * 10, "b" * 6]))
    assert (error.field, error.limit) == ("stop", "max_stop_chars")


def test_top_logprobs_num_is_capped_at_20_by_default():
    check_request(request(top_logprobs_num=20), LimitsConfig())
    with pytest.raises(RequestLimitError) as info:
        check_request(request(top_logprobs_num=49151), LimitsConfig())
    assert (info.value.field, info.value.limit) == ("top_logprobs_num", "max_top_logprobs_num")


@pytest.mark.parametrize("field", ["json_schema", "structural_tag"])
def test_a_constraint_nested_too_deeply(field):
    deep = {"type": "object", "properties": {"a": {"type": "object", "properties": {}}}}
    if field == "structural_tag":
        deep = {"type": "structural_tag", "format": {"a": [[{"b": 1}]]}}
    error = refusal(request(**{field: deep}))
    assert (error.field, error.limit) == (field, "max_json_depth")


def test_json_depth_of_text():
    check_json_depth('[[["]]]]]"]]]', "arguments", LIMITS)
    with pytest.raises(RequestLimitError, match="nested 4 levels deep; at most 3"):
        check_json_depth("[[[[]]]]", "arguments", LIMITS)


def test_logprob_entries_count_positions_and_alternatives():
    off = LogprobSpec(False, 0, 5)
    assert logprob_entries(off, 100, 10) == 0
    assert logprob_entries(LogprobSpec(True, 1 << 62, 0), 100, 10) == 10  # output only
    assert logprob_entries(LogprobSpec(True, 0, 20), 300, 10) == 310 * 21
    assert logprob_entries(LogprobSpec(True, 250, 1), 300, 10) == 60 * 2


def test_a_call_past_max_logprob_entries():
    limits = LimitsConfig(max_logprob_entries=100)
    check_logprob_entries([50, 50], limits)
    with pytest.raises(RequestLimitError) as info:
        check_logprob_entries([50, 51], limits)
    assert info.value.limit == "max_logprob_entries" and "101" in str(info.value)


def test_limits_are_engine_options():
    config = EngineConfig.from_kwargs(max_stop_chars=100, max_logprob_entries=7)
    assert (config.limits.max_stop_chars, config.limits.max_logprob_entries) == (100, 7)
    assert LimitsConfig().max_top_logprobs_num == 20


@pytest.mark.parametrize("kwargs", [{"max_json_depth": 0}, {"max_stop_chars": "1"}])
def test_bad_limits_are_config_errors(kwargs):
    with pytest.raises(ConfigError):
        LimitsConfig(**kwargs)
