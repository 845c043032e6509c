"""The primitives check their arguments where the program writes them."""

from __future__ import annotations

import pytest

import radixlm as sgl
from radixlm.ir import ExprList, Gen, RoleBegin, RoleEnd, Select, Text
from tests.lang.user_methods import LeastLikely


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: sgl.gen("x", dtype="complex"), "dtype must be one of int, float, bool, str"),
        (lambda: sgl.gen("x", regex="(ab"), "not a valid regular expression"),
        (lambda: sgl.gen("x", max_tokens=-1), "max_new_tokens"),
        (lambda: sgl.gen("x", temperature=-0.5), "temperature"),
        (lambda: sgl.gen("x", top_p=0), "top_p"),
        (lambda: sgl.gen("x", dtype=int, regex="[0-9]+"), "exclusive"),
        (lambda: sgl.gen("x", stop=[""]), "stop must be a non-empty str"),
        (lambda: sgl.gen("x", stop_regex="("), "not a valid regular expression"),
        (lambda: sgl.gen("x", json_schema="{not json"), "json_schema"),
        (lambda: sgl.gen(3), "variable name must be a str"),
        (lambda: sgl.select("x", choices=[]), "non-empty list"),
        (lambda: sgl.select("x", choices="ab"), "non-empty list"),
        (lambda: sgl.select("x", choices=["a", ""]), "non-empty str"),
        (lambda: sgl.select("x", choices=["a"], temperature=-1), "temperature"),
        (lambda: sgl.select("x", choices=["a"], choices_method=max), "choices_method"),
        (
            lambda: sgl.select("x", choices=["a"], choices_method=LeastLikely),
            "choices_method must be an instance",
        ),
        (lambda: sgl.separate_reasoning(), "needs the gen"),
    ],
)
def test_bad_arguments_raise_where_written(build, message):
    with pytest.raises(sgl.ProgramArgumentError, match=message):
        build()


def test_a_bad_argument_is_a_value_error():
    with pytest.raises(ValueError):
        sgl.gen("x", max_tokens=-1)


def test_gen_with_choices_is_a_select_and_roles_wrap_their_content():
    picked = sgl.gen("x", choices=["a", "b"])
    assert isinstance(picked, Select) and picked.choices == ("a", "b")
    assert picked.choices_method is sgl.token_length_normalized and picked.temperature == 0.0
    mine = LeastLikely()
    assert sgl.gen("x", choices=["a", "b"], choices_method=mine).choices_method is mine
    block = sgl.user("hi" + sgl.gen("y"))
    assert isinstance(block, ExprList)
    assert block.items[0] == RoleBegin("user") and block.items[-1] == RoleEnd("user")
    assert block.items[1].items[0] == Text("hi") and isinstance(block.items[1].items[1], Gen)


def test_gen_records_its_own_arguments_only():
    g = sgl.gen("x", max_tokens=7, stop="\n", temperature=0, json_schema={"type": "integer"})
    params = g.params
    assert (params.max_new_tokens, params.stop, params.temperature) == (7, ("\n",), 0)
    assert params.json_schema == '{"type":"integer"}' and params.top_p is None
    assert sgl.gen_int("n").dtype == "int" and sgl.gen_string("s").dtype == "str"
    assert sgl.gen("b", dtype=bool).dtype == "bool"
