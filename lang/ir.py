"""The program DSL's expression nodes: what ``s += ...`` appends to a program state.

The primitives in ``api.py`` build these (validating their arguments eagerly); the
interpreter (``interpreter.py``) executes them in order on a program stream::

    sgl.user("Hi") + sgl.gen("a")  ->  ExprList([RoleBegin("user"), Text("Hi"),
                                                 RoleEnd("user"), Gen("a", ...)])

Every node is frozen; ``a + b`` concatenates into an ``ExprList``.

The regexes a gen's ``dtype`` constrains its text to are SGLang's (``REGEX_INT``,
``REGEX_FLOAT``, ``REGEX_BOOL``, ``REGEX_STR``, importable from here as from
``sglang.lang.ir``); int and float gens also stop at a space or newline (``DTYPE_STOP``,
as SGLang's runtime backend adds), which the regexes allow after the number, so the
text is the number alone. ``REGEX_JSON_STR`` is a JSON string literal, for
``gen(regex=REGEX_JSON_STR)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, make_dataclass
from typing import TYPE_CHECKING, Any

from radixlm.runtime.io.sampling_fields import SAMPLING_FIELDS, SamplingField

if TYPE_CHECKING:
    from radixlm.choices import ChoicesSamplingMethod

__all__ = [
    "DTYPE_REGEX",
    "DTYPE_STOP",
    "REGEX_BOOL",
    "REGEX_FLOAT",
    "REGEX_INT",
    "REGEX_JSON_STR",
    "REGEX_STR",
    "Expr",
    "ExprList",
    "Gen",
    "GenParams",
    "Image",
    "PLACEHOLDER_MARK",
    "RoleBegin",
    "RoleEnd",
    "Select",
    "SeparateReasoning",
    "SymbolicArgument",
    "SymbolicFormatError",
    "Text",
    "VarScopeBegin",
    "VarScopeEnd",
    "Video",
    "placeholder",
    "text_of",
    "to_expr",
]

REGEX_INT = r"[+-]?[0-9]+[ \n]*"
REGEX_FLOAT = r"[+-]?[0-9]*\.?[0-9]+[ \n]*"
REGEX_BOOL = r"(True|False)"
REGEX_STR = r'"[\w\d\s]*"'  # word characters and whitespace between double quotes
# Any JSON string literal (json.loads reads it back): radixlm's dtype=str before it
# took SGLang's REGEX_STR.
REGEX_JSON_STR = r'"([^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"'
DTYPE_REGEX = {"int": REGEX_INT, "float": REGEX_FLOAT, "bool": REGEX_BOOL, "str": REGEX_STR}
DTYPE_STOP = {"int": (" ", "\n"), "float": (" ", "\n")}

PLACEHOLDER_MARK = "\x00"  # brackets a placeholder's name; never in real text


def placeholder(name: str) -> str:
    """The text standing for variable or argument ``name`` in a trace: the name
    between NUL characters, which never occur in real text."""
    return f"{PLACEHOLDER_MARK}{name}{PLACEHOLDER_MARK}"


class SymbolicFormatError(TypeError):
    """A traced program formatted a symbolic argument into a string."""


class SymbolicArgument(str):
    """An argument ``trace()`` was not given (SGLang's ``SglArgument``). Its text is
    its ``placeholder``, so appending it works (``s += "Q: " + arg``, ``sgl.user(arg)``);
    formatting it into a string (``f"{arg}"``, ``str(arg)``, ``"%s" % arg``,
    ``"{}".format(arg)``) raises ``SymbolicFormatError``: the trace would record the
    placeholder as if it were constant text."""

    name: str

    def __new__(cls, name: str) -> SymbolicArgument:
        self = super().__new__(cls, placeholder(name))
        self.name = name
        return self

    def __format__(self, spec: str) -> str:
        raise self._error()

    def __str__(self) -> str:
        raise self._error()

    def _error(self) -> SymbolicFormatError:
        return SymbolicFormatError(
            f"argument {self.name!r} is symbolic while the program is traced: it cannot "
            f"be formatted into a string (f-string, str(), %, format()). Append it "
            f"instead: s += 'text ' + {self.name}"
        )


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
    return Text(text_of(value))


def text_of(value: Any) -> str:
    """``str(value)``; a symbolic argument's placeholder text (appending is not formatting)."""
    return str.__str__(value) if isinstance(value, SymbolicArgument) else str(value)


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


# What a GenParams field holds, by the table's kind (None always: the run() default).
GEN_PARAM_TYPES: dict[str, Any] = {
    "float": float,
    "int": int,
    "bool": bool,
    "strings": tuple[str, ...],
    "token_ids": tuple[int, ...],
    "grammar": str,
    "option": str,
}
# run() sets these from global_config; no gen() keyword takes them (as in SGLang).
RUN_SETTINGS = frozenset({"skip_special_tokens", "spaces_between_special_tokens"})
# A gen's request options beside its sampling parameters (gen() keywords, SGLang's).
LOGPROB_OPTIONS: dict[str, type] = {
    "return_logprob": bool,
    "logprob_start_len": int,
    "top_logprobs_num": int,
    "return_text_in_logprobs": bool,
}


def gen_params_class(table: Sequence[SamplingField]) -> type:
    """The GenParams class over a sampling table: its fields that gen() or run() set
    (and ``RUN_SETTINGS``), in its order under the engine's names, then the logprob
    options; every one None by default (the ``run()`` default)."""
    sampling = {
        spec.name: GEN_PARAM_TYPES[spec.kind]
        for spec in table
        if spec.names_on("gen") or spec.names_on("run") or spec.name in RUN_SETTINGS
    }
    typed = {**sampling, **LOGPROB_OPTIONS}
    return make_dataclass(
        "GenParams",
        [(name, typ | None, field(default=None)) for name, typ in typed.items()],
        frozen=True,
        namespace={"__module__": __name__, "__doc__": _GEN_PARAMS_DOC, "over": _over},
    )


def _over(self: Any, defaults: Any) -> Any:
    """These arguments where set, ``defaults`` elsewhere."""
    return type(self)(
        **{
            f.name: getattr(defaults, f.name)
            if getattr(self, f.name) is None
            else getattr(self, f.name)
            for f in fields(self)
        }
    )


_over.__name__, _over.__qualname__ = "over", "GenParams.over"
_GEN_PARAMS_DOC = """A ``gen``'s own sampling arguments and request options; None: the ``run()``
default. The sampling fields are the table's (``runtime/io/sampling_fields``) under the
engine's names: ``max_new_tokens`` is ``gen(max_tokens=...)``, ``min_new_tokens`` its
``min_tokens``. ``skip_special_tokens`` and ``spaces_between_special_tokens`` are no
``gen`` arguments (as in SGLang): ``run()`` fills them from ``global_config``."""
GenParams = gen_params_class(SAMPLING_FIELDS)


@dataclass(frozen=True)
class Gen(Expr):
    """Generate text into variable ``name`` (and the program's text).

    dtype: "int" | "float" | "bool" | "str" | None: the text is constrained by
        ``DTYPE_REGEX[dtype]`` (SGLang's regexes), int and float also stopped by
        ``DTYPE_STOP``.
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
