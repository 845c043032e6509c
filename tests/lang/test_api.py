"""The primitives check their arguments where the program writes them."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

import radixlm as sgl
from radixlm.api import gen_signature
from radixlm.ir import ExprList, Gen, RoleBegin, RoleEnd, Select, Text, gen_params_class
from radixlm.runtime.io.sampling_fields import SAMPLING_FIELDS, Bound, _field, fields_on
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


# ---- gen's signature is the sampling table's --------------------------------------------

# SGLang's gen(), argument by argument: programs may pass any of them by position.
SGLANG_GEN = (
    "name",
    "max_tokens",
    "min_tokens",
    "n",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "ignore_eos",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "return_text_in_logprobs",
    "dtype",
    "choices",
    "choices_method",
    "regex",
    "json_schema",
)
# A field the table does not have, as one would add it (the builder _field, gen=).
TYPICAL_P = _field("typical_p", "float", 1.0, Bound(0, 1, low_open=True), gen="typical_p")


def test_gens_signature_is_the_tables_gen_names_in_order_and_sglangs():
    parameters = inspect.signature(sgl.gen).parameters
    table = [spec.names_on("gen")[0] for spec in fields_on("gen")]
    assert [name for name in parameters if name in table] == table
    # SGLang's arguments in SGLang's order, then radixlm's own (after json_schema)
    assert tuple(parameters) == (*SGLANG_GEN, "max_reasoning_tokens", "json_max_string_length")
    assert all(p.default is None and p.kind is p.POSITIONAL_OR_KEYWORD for p in parameters.values())
    assert parameters["temperature"].annotation == float | None
    assert parameters["top_k"].annotation == int | None


def test_gen_binds_positional_arguments_in_sglangs_order():
    params = sgl.gen("x", 16, 2, 1, "\n", [7], None, 0.5).params
    assert (params.max_new_tokens, params.min_new_tokens, params.n) == (16, 2, 1)
    assert (params.stop, params.stop_token_ids, params.temperature) == (("\n",), (7,), 0.5)


def test_gen_refuses_an_argument_it_does_not_take_as_python_does():
    with pytest.raises(TypeError, match=r"^gen\(\) got an unexpected keyword argument 'x'$"):
        sgl.gen("a", x=1)
    with pytest.raises(TypeError, match="repetition_penalty"):  # the table's, but not gen's
        sgl.gen("a", repetition_penalty=1.1)
    with pytest.raises(TypeError, match="positional"):
        sgl.gen(*SGLANG_GEN, None, None, "one too many")


def test_a_field_added_to_the_table_is_a_gen_keyword_and_a_genparams_field():
    signature = gen_signature([*fields_on("gen"), TYPICAL_P])
    # after the others: no positional argument shifts
    own = ("max_reasoning_tokens", "json_max_string_length", "typical_p")
    assert tuple(signature.parameters) == (*SGLANG_GEN, *own)
    assert signature.parameters["typical_p"].annotation == float | None
    params = gen_params_class((*SAMPLING_FIELDS, TYPICAL_P))
    assert "typical_p" in {f.name for f in dataclasses.fields(params)}
    assert params(typical_p=0.5).over(params(temperature=0.1)).typical_p == 0.5
