"""The nodes of an expression in order, and the variables it sets."""

from __future__ import annotations

from radixlm.choices import greedy_token_selection
from radixlm.ir import ExprList, Gen, Select, SeparateReasoning, Text, VarScopeBegin, VarScopeEnd
from radixlm.ir_walk import defined_names, named_gens_and_selects, walk


def test_walk_and_the_names_set():
    select = Select("c", ("a", "b"), 0.0, greedy_token_selection)
    inner = ExprList((Gen("g"), Text("t"), ExprList((select, Gen(None)))))
    expr = ExprList((VarScopeBegin("v"), inner, VarScopeEnd("v"), SeparateReasoning(None, inner)))
    assert [type(n).__name__ for n in walk(inner)] == [
        "ExprList", "Gen", "Text", "ExprList", "Select", "Gen",
    ]  # fmt: skip
    assert named_gens_and_selects(expr) == ["g", "c"]
    assert defined_names(expr) == ["g", "c", "v", "g_reasoning_content", "c_reasoning_content"]
