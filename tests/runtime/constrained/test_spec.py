"""constrained.spec: the one-constraint rule, as every caller applies it."""

from __future__ import annotations

import pytest

from radixlm.runtime.constrained.spec import check_one_constraint
from radixlm.runtime.errors import ConstraintConflictError, InvalidSamplingParamsError


def test_none_or_one_constraint_passes():
    assert check_one_constraint([]) is None
    assert check_one_constraint(iter([("guided_json", "json_schema")])) == (
        "guided_json",
        "json_schema",
    )


def test_a_second_constraint_is_refused_by_the_callers_names():
    with pytest.raises(ConstraintConflictError) as info:
        check_one_constraint([("regex", "regex"), ("guided_json", "json_schema"), ("x", "lark")])
    e = info.value
    assert isinstance(e, InvalidSamplingParamsError)
    assert (e.first, e.field) == ("regex", "guided_json")
    reason = "guided_json cannot be combined with regex: a request takes one output constraint"
    assert e.reason == reason
    assert str(e) == f"sampling parameter 'guided_json': {e.reason}"


def test_a_kind_that_is_no_constraint_is_the_callers_bug():
    with pytest.raises(ValueError, match="'max_new_tokens'") as info:
        check_one_constraint([("max_tokens", "max_new_tokens")])
    assert not isinstance(info.value, ConstraintConflictError)
