"""Recording a program's expressions without running it (``SglFunction.trace``), and
its constant prefix (``SglFunction.cache``).

The tracing state accepts everything a ``ProgramState`` does. A variable read in
the body is a placeholder (``ir.placeholder(name)``: the name between NUL
characters, which never occur in real text), an argument not given a
``SymbolicArgument`` (whose text is that placeholder). So a body that branches on
generated text traces one path, and a body that cannot go on with a placeholder (a
select whose choices are an argument) is traced up to that point. Forks trace their
first branch.

Formatting a symbolic argument into a string (``f"{arg}"``, ``str(arg)``, ...) raises
``TypeError`` out of ``trace()``, as SGLang's tracer: the trace would hold the
placeholder as constant text. A prefix trace (``cache``, ``run_batch``'s precache)
stops there instead, and at the first expression that is not constant text: the
prefix ends there, and the body is not run further (it may loop on generated text).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from radixlm.interpreter import RoleBlocks
from radixlm.ir import (
    PLACEHOLDER_MARK,
    Expr,
    ExprList,
    RoleBegin,
    RoleEnd,
    SymbolicArgument,
    SymbolicFormatError,
    Text,
    VarScopeBegin,
    VarScopeEnd,
    placeholder,
    to_expr,
)
from radixlm.runtime.io.chat_template import ChatTemplate

if TYPE_CHECKING:
    from radixlm.function import SglFunction

__all__ = ["TracingState", "constant_prefix", "placeholder", "trace_program"]

# What a body may raise because an argument is a placeholder (int(arg), arg["key"],
# arg.items(), select(choices=arg), ...): the trace is what it appended before.
_PLACEHOLDER_ERRORS = (ValueError, TypeError, KeyError, IndexError, AttributeError)


class _PrefixEnd(Exception):
    """A prefix trace reached an expression that is not constant text."""


class TracingState(RoleBlocks):
    """Records appended expressions in order.

    prefix_only: stop the body (``_PrefixEnd``) once an expression that is not
        constant text is appended.
    """

    def __init__(self, nodes: list[Expr], prefix_only: bool = False) -> None:
        self.nodes = nodes
        self.prefix_only = prefix_only
        self.variables: dict[str, Any] = {}

    def __iadd__(self, other: Any) -> TracingState:
        self._append_node(to_expr(other))
        return self

    def _append_node(self, expr: Expr) -> None:
        self.nodes.append(expr)
        if self.prefix_only and not all(_is_constant(node) for node in _flat([expr])):
            raise _PrefixEnd

    def __getitem__(self, name: str) -> Any:
        return self.variables.get(name, placeholder(name))

    def __setitem__(self, name: str, value: Any) -> None:
        self.variables[name] = value

    def __contains__(self, name: str) -> bool:
        return True

    get_var = __getitem__
    set_var = __setitem__

    def get_meta_info(self, name: str) -> dict[str, Any]:
        return {}

    def text(self) -> str:
        return ""

    def messages(self) -> list[dict[str, str]]:
        return []

    def sync(self) -> None:
        return None

    def error(self) -> None:
        return None

    def fork(self, size: int = 1) -> _TracingGroup:
        return _TracingGroup([self] + [TracingState([]) for _ in range(size - 1)])

    @contextmanager
    def copy(self) -> Iterator[TracingState]:
        yield self


class _TracingGroup:
    def __init__(self, states: list[TracingState]) -> None:
        self.states = states

    def __getitem__(self, i: int) -> TracingState:
        return self.states[i]

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[TracingState]:
        return iter(self.states)

    def __iadd__(self, other: Any) -> _TracingGroup:
        for i, state in enumerate(self.states):
            if callable(other) and not isinstance(other, Expr):
                state += other(i)
            elif isinstance(other, list | tuple):
                state += other[i]
            else:
                state += other
        return self

    def join(self, mode: str = "gather_variable") -> None:
        return None


def trace_program(
    func: SglFunction, args: tuple, kwargs: dict[str, Any], prefix_only: bool = False
) -> list[Expr]:
    """The expressions ``func``'s body appends, in order; missing arguments are
    ``SymbolicArgument``s. With ``prefix_only``, the body stops after the first
    expression that is not constant text.

    Raises:
        TypeError: (not ``prefix_only``) the body formatted a symbolic argument.
    """
    nodes: list[Expr] = []
    filled = {name: SymbolicArgument(name) for name in func.arg_names[len(args) :]}
    try:
        func.func(TracingState(nodes, prefix_only), *args, **{**filled, **kwargs})
    except SymbolicFormatError:
        if not prefix_only:
            raise
    except _PrefixEnd:
        pass
    except _PLACEHOLDER_ERRORS:
        # The body cannot go on with a placeholder (e.g. select(choices=<an argument>)):
        # what it appended before that is the trace, and all a constant prefix needs.
        pass
    return nodes


def constant_prefix(nodes: list[Expr], template: ChatTemplate) -> str:
    """The text the expressions produce before the first gen, select or placeholder."""
    text, messages = "", 0
    for node in _flat(nodes):
        if isinstance(node, Text):
            cut = node.value.find(PLACEHOLDER_MARK)
            if cut >= 0:  # a placeholder: what follows depends on the arguments
                return text + node.value[:cut]
            text += node.value
        elif isinstance(node, RoleBegin):
            text += template.prefix_and_suffix(node.role, messages)[0]
        elif isinstance(node, RoleEnd):
            text += template.prefix_and_suffix(node.role, messages)[1]
            messages += 1
        elif not isinstance(node, VarScopeBegin | VarScopeEnd):
            break  # a gen, a select, an image, ...: what follows is generated
    return text


def _is_constant(node: Expr) -> bool:
    """Whether ``node`` (not a list) adds the same text whatever the arguments."""
    if isinstance(node, Text):
        return PLACEHOLDER_MARK not in node.value
    return isinstance(node, RoleBegin | RoleEnd | VarScopeBegin | VarScopeEnd)


def _flat(nodes: list[Expr]) -> Iterator[Expr]:
    for node in nodes:
        if isinstance(node, ExprList):
            yield from _flat(list(node.items))
        else:
            yield node
