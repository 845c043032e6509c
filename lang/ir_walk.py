"""Reading a program's expression tree: its nodes in order and the variables it sets.

The stream executor asks these before running an expression (which variables will a
reader of ``s["x"]`` have to wait for?) and while running one (which gens does a
``separate_reasoning`` cover?).
"""

from __future__ import annotations

from collections.abc import Iterator

from radixlm.ir import Expr, ExprList, Gen, Select, SeparateReasoning, VarScopeEnd

__all__ = ["defined_names", "named_gens_and_selects", "walk"]


def walk(expr: Expr) -> Iterator[Expr]:
    """``expr`` and, for a list, every node inside it, depth first in program order."""
    yield expr
    if isinstance(expr, ExprList):
        for item in expr.items:
            yield from walk(item)


def named_gens_and_selects(expr: Expr) -> list[str]:
    """The variable names of the named gens and selects in ``expr``, in order."""
    return [
        node.name for node in walk(expr) if isinstance(node, Gen | Select) and node.name is not None
    ]


def defined_names(expr: Expr) -> list[str]:
    """The variables ``expr`` sets (readers of them wait until it has run)."""
    names = []
    for node in walk(expr):
        if isinstance(node, Gen | Select) and node.name is not None:
            names.append(node.name)
        elif isinstance(node, VarScopeEnd):
            names.append(node.name)
        elif isinstance(node, SeparateReasoning):
            names += [f"{n}_reasoning_content" for n in defined_names(node.expr)]
    return names
