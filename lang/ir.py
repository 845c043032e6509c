"""The program DSL's expression nodes: what ``s += ...`` appends to a program state.

The primitives in ``api.py`` build these (validating their arguments eagerly); the
interpreter (``interpreter.py``) executes them in order on a program stream::

    sgl.user("Hi") + sgl.gen("a")  ->  ExprList([RoleBegin("user"), Text("Hi"),
                                                 RoleEnd("user"), Gen("a", ...)])

Every node is frozen; ``a + b`` concatenates into an ``ExprList``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radixlm.choices import ChoicesSamplingMethod

__all__ = [
    "Expr",
    "ExprList",
    "Gen",
    "GenParams",
    "Image",
    "RoleBegin",
    "RoleEnd",
    "Select",
    "SeparateReasoning",
    "Text",
    "VarScopeBegin",
    "VarScopeEnd",
    "Video",
    "to_expr",
]


class Expr:
    """A node of a program; ``+`` joins nodes (and strings) in order."""

    def __add__(self, other: Expr | str) -> ExprList:
        return ExprList((*_items(self), *_items(to_expr(other))))

    def __radd__(self, other: Expr | str) -> ExprList:
        return ExprList((*_items(to_expr(other)), *_items(self)))


def to_expr(value: Expr | str | Any) -> Expr:
    """A node for ``value``: nodes as they are, anything else as its text (as SGLang)."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, list | tuple):
        return ExprList(tuple(to_expr(v) for v in value))
    if value is None:
        raise ValueError("cannot append None to a program state")
    return Text(str(value))


def _items(expr: Expr) -> tuple[Expr, ...]:
    return expr.items if isinstance(expr, ExprList) else (expr,)


@dataclass(frozen=True)
class Text(Expr):
    """Constant text appended to the program's text."""

    value: str


@dataclass(frozen=True)
class ExprList(Expr):
    items: tuple[Expr, ...]


@dataclass(frozen=True)
class RoleBegin(Expr):
    role: str  # "system" | "user" | "assistant"


@dataclass(frozen=True)
class RoleEnd(Expr):
    role: str


@dataclass(frozen=True)
class GenParams:
    """A ``gen``'s own sampling arguments; None: the ``run()`` default (SGLang's names).

    ``max_new_tokens`` is ``gen(max_tokens=...)``, ``min_new_tokens`` its ``min_tokens``.
    """

    max_new_tokens: int | None = None
    min_new_tokens: int | None = None
    n: int | None = None
    stop: tuple[str, ...] | None = None
    stop_token_ids: tuple[int, ...] | None = None
    stop_regex: tuple[str, ...] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    ignore_eos: bool | None = None
    return_logprob: bool | None = None
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    return_text_in_logprobs: bool | None = None
    regex: str | None = None
    json_schema: str | None = None

    def over(self, defaults: GenParams) -> GenParams:
        """These arguments where set, ``defaults`` elsewhere."""
        return GenParams(
            **{
                f.name: getattr(defaults, f.name)
                if getattr(self, f.name) is None
                else getattr(self, f.name)
                for f in fields(self)
            }
        )


@dataclass(frozen=True)
class Gen(Expr):
    """Generate text into variable ``name`` (and the program's text).

    dtype: "int" | "float" | "bool" | "str" | None: the text is constrained to
        that type's literal (``int(s[name])`` always works for "int").
    """

    name: str | None
    params: GenParams = field(default_factory=GenParams)
    dtype: str | None = None


@dataclass(frozen=True)
class Select(Expr):
    """Append the most likely of ``choices`` (see ``radixlm.choices``) into ``name``."""

    name: str | None
    choices: tuple[str, ...]
    temperature: float
    choices_method: ChoicesSamplingMethod


@dataclass(frozen=True)
class VarScopeBegin(Expr):
    name: str


@dataclass(frozen=True)
class VarScopeEnd(Expr):
    name: str


@dataclass(frozen=True)
class Image(Expr):
    path: str


@dataclass(frozen=True)
class Video(Expr):
    path: str
    num_frames: int


@dataclass(frozen=True)
class SeparateReasoning(Expr):
    """After ``expr`` (a gen or select, or a list of them) ran: move the reasoning
    (``<think>...</think>``) out of each variable into ``<name>_reasoning_content``."""

    model_type: str | None
    expr: Expr
