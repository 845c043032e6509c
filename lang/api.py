"""The DSL's primitives, under SGLang's names and arguments.

Each builds an expression node (``ir.py``) and checks its arguments where it is
called: a bad argument raises ``ProgramArgumentError`` (a ``ValueError``) at the
line that wrote it, not later inside a running program.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Sequence
from typing import Any

from radixlm.choices import ChoicesSamplingMethod, token_length_normalized
from radixlm.ir import (
    LOGPROB_OPTIONS,
    Expr,
    ExprList,
    Gen,
    GenParams,
    Image,
    RoleBegin,
    RoleEnd,
    Select,
    SeparateReasoning,
    Video,
    text_of,
    to_expr,
)
from radixlm.runtime.errors import InvalidRequestError
from radixlm.runtime.io.sampling_fields import SamplingField, fields_on, sampling_field
from radixlm.runtime.io.sampling_params import SamplingParams
from radixlm.runtime.reasoning import reasoning_format

__all__ = [
    "ProgramArgumentError",
    "assistant",
    "assistant_begin",
    "assistant_end",
    "gen",
    "gen_int",
    "gen_string",
    "image",
    "select",
    "separate_reasoning",
    "system",
    "system_begin",
    "system_end",
    "user",
    "user_begin",
    "user_end",
    "video",
]

DTYPES = {int: "int", float: "float", bool: "bool", str: "str"}


class ProgramArgumentError(InvalidRequestError):
    """A DSL primitive got an argument it cannot use; the message names it."""


def gen(*args: Any, **kwargs: Any) -> Gen | Select:
    """Generate into variable ``name``. Arguments left None take the ``run()`` defaults.

    The sampling keywords are the table's (``runtime/io/sampling_fields``: their names
    on the ``gen`` surface, types and bounds); the signature (``inspect.signature``,
    ``help``) lists them in SGLang's order, which positional calls follow too.
    ``choices`` makes it a ``select``; ``dtype`` (int, float, bool, str or their
    names) constrains the text by SGLang's regex for it (``radixlm.ir.DTYPE_REGEX``;
    int and float also stop at a space or newline, so the text is the number alone);
    ``regex`` / ``json_schema`` (a dict, JSON text or a pydantic model class)
    constrain it to a pattern / schema.

    Raises:
        TypeError: an argument gen does not take (as Python says it).
        ProgramArgumentError: a bad value, or two constraints at once.
    """
    values = _bound_arguments(args, kwargs)
    name = values.get("name")
    if values.get("choices") is not None:
        temperature = values.get("temperature")
        return select(
            name,
            values["choices"],
            0.0 if temperature is None else temperature,
            values.get("choices_method") or token_length_normalized,
        )
    kind = _dtype_name(values.get("dtype"))
    if kind is not None and any(values.get(key) is not None for key in _GEN_CONSTRAINTS):
        raise ProgramArgumentError(f"gen {name!r}: dtype and regex/json_schema are exclusive")
    params = GenParams(
        **{spec.name: _normalised(key, spec, values.get(key)) for key, spec in _GEN_FIELDS.items()},
        **{option: values.get(option) for option in LOGPROB_OPTIONS},
    )
    _check_sampling(name, params)
    return Gen(_name(name), params, kind)


def gen_int(name: str | None = None, **kwargs: Any) -> Gen:
    """``gen(name, dtype=int, ...)``: the text is an integer literal (``REGEX_INT``)."""
    return gen(name, dtype=int, **kwargs)  # type: ignore[return-value]


def gen_string(name: str | None = None, **kwargs: Any) -> Gen:
    """``gen(name, dtype=str, ...)``: word characters and whitespace between double
    quotes (SGLang's ``REGEX_STR``). Any JSON string literal instead:
    ``gen(name, regex=radixlm.ir.REGEX_JSON_STR)``."""
    return gen(name, dtype=str, **kwargs)  # type: ignore[return-value]


def select(
    name: str | None = None,
    choices: Sequence[str] | None = None,
    temperature: float = 0.0,
    choices_method: ChoicesSamplingMethod = token_length_normalized,
) -> Select:
    """Append the most likely of ``choices`` (scored by ``choices_method``) into ``name``.

    The pick is deterministic (as SGLang's runtime); ``temperature`` is accepted for
    compatibility and checked as gen's (``runtime/io/sampling_fields``).
    ``choices_method``: an instance of a ``radixlm.choices.ChoicesSamplingMethod`` (a
    built-in one or your own subclass).
    """
    if not choices or isinstance(choices, str):
        raise ProgramArgumentError(f"select {name!r}: choices must be a non-empty list of str")
    values = tuple(choices)
    bad = [c for c in values if not isinstance(c, str) or not c]
    if bad:
        raise ProgramArgumentError(
            f"select {name!r}: every choice must be a non-empty str, got {bad[0]!r}"
        )
    try:
        sampling_field("temperature").check(temperature, "gen")
    except InvalidRequestError as e:
        raise ProgramArgumentError(f"select {name!r}: {e}") from e
    if (
        isinstance(choices_method, type)
        or not callable(choices_method)
        or not hasattr(choices_method, "requires_unconditional_logprobs")
    ):
        raise ProgramArgumentError(
            f"select {name!r}: choices_method must be an instance of a "
            "radixlm.choices.ChoicesSamplingMethod (sgl.token_length_normalized, "
            f"sgl.greedy_token_selection, ... or your own subclass), got {choices_method!r}"
        )
    return Select(_name(name), values, float(temperature), choices_method)


def image(path: str) -> Image:
    return Image(text_of(path))


def video(path: str, num_frames: int) -> Video:
    return Video(text_of(path), int(num_frames))


def separate_reasoning(expr: Expr | None = None, model_type: str | None = None) -> Expr:
    """``expr``, then its variables' ``<think>...</think>`` part moved into
    ``<name>_reasoning_content`` (the rest stays in ``<name>`` and the text).

    ``model_type``: the runtime's reasoning format (``radixlm.runtime.reasoning``:
    "deepseek-r1", "qwen3", ...; None: the generic ``<think>``), as the server's
    ``--reasoning-parser`` names it.

    Raises:
        UnknownReasoningParserError (a ValueError): an unknown ``model_type``.
    """
    if expr is None:
        raise ProgramArgumentError("separate_reasoning needs the gen (or select) to split")
    if model_type is not None:
        reasoning_format(model_type)
    return ExprList((to_expr(expr), SeparateReasoning(model_type, to_expr(expr))))


def _role(role: str) -> Callable[[Any], ExprList]:
    def block(expr: Any = None) -> ExprList:
        inner = () if expr is None else (to_expr(expr),)
        return ExprList((RoleBegin(role), *inner, RoleEnd(role)))

    block.__name__ = role
    block.__doc__ = f"A {role} block around ``expr``, in the model's chat template."
    return block


system, user, assistant = _role("system"), _role("user"), _role("assistant")


def system_begin() -> RoleBegin:
    return RoleBegin("system")


def system_end() -> RoleEnd:
    return RoleEnd("system")


def user_begin() -> RoleBegin:
    return RoleBegin("user")


def user_end() -> RoleEnd:
    return RoleEnd("user")


def assistant_begin() -> RoleBegin:
    return RoleBegin("assistant")


def assistant_end() -> RoleEnd:
    return RoleEnd("assistant")


# ---- argument checks ------------------------------------------------------------------


def _name(name: Any) -> str | None:
    if name is not None and not isinstance(name, str):
        raise ProgramArgumentError(f"a variable name must be a str, got {name!r}")
    return name


def _dtype_name(dtype: Any) -> str | None:
    if dtype is None:
        return None
    if dtype in DTYPES:
        return DTYPES[dtype]
    if dtype in DTYPES.values():
        return dtype
    raise ProgramArgumentError(
        f"dtype must be one of int, float, bool, str (or their names), got {dtype!r}"
    )


def _strings(field: str, value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, str | list | tuple):
        raise ProgramArgumentError(
            f"{field} must be a non-empty str or a list of them, got {value!r}"
        )
    values = (value,) if isinstance(value, str) else tuple(value)
    if not all(isinstance(v, str) and v for v in values):
        raise ProgramArgumentError(
            f"{field} must be a non-empty str or a list of them, got {value!r}"
        )
    return values


def _token_ids(value: Any) -> tuple[int, ...] | None:
    """A list of token ids as a tuple (the ids themselves: ``_check_sampling``)."""
    if value is None:
        return None
    if not isinstance(value, list | tuple):
        raise ProgramArgumentError(f"stop_token_ids must be a list of int, got {value!r}")
    return tuple(value)


def _pattern(field: str, pattern: Any) -> str:
    if not isinstance(pattern, str) or not pattern:
        raise ProgramArgumentError(f"{field} must be a non-empty str, got {pattern!r}")
    try:
        re.compile(pattern)
    except re.error as e:
        raise ProgramArgumentError(
            f"{field} {pattern!r} is not a valid regular expression: {e}"
        ) from e
    return pattern


def _patterns(values: tuple[str, ...] | None) -> tuple[str, ...] | None:
    return None if values is None else tuple(_pattern("stop_regex", v) for v in values)


def _schema_text(schema: Any) -> str:
    """The schema as canonical JSON text (what ``SamplingParams`` stores), checked."""
    try:
        return SamplingParams(json_schema=schema).json_schema  # type: ignore[return-value]
    except InvalidRequestError as e:
        raise ProgramArgumentError(f"json_schema: {e}") from e


# ---- gen's signature: the table's keywords and gen's own ------------------------------

# What each kind of keyword takes: the annotations help(gen) shows.
_KEYWORD_TYPES: dict[str, Any] = {
    "float": float | None,
    "int": int | None,
    "bool": bool | None,
    "strings": str | Sequence[str] | None,
    "token_ids": Sequence[int] | None,
    "grammar": Any,  # regex: a str; json_schema: a dict, JSON text or a pydantic model
    "option": str | None,
}
# gen()'s arguments that are no sampling parameters: the logprob options, then the
# select's and dtype's; they sit before the table's constraints, as in SGLang's gen.
_OWN_ARGUMENTS: dict[str, Any] = {
    **{option: typ | None for option, typ in LOGPROB_OPTIONS.items()},
    "dtype": type | str | None,
    "choices": Sequence[str] | None,
    "choices_method": ChoicesSamplingMethod | None,
}


def gen_signature(fields: Sequence[SamplingField]) -> inspect.Signature:
    """gen()'s signature over the table's gen ``fields`` (in order): ``name``, the fields
    before the first constraint (``regex``), gen's own arguments, then the rest. Every
    argument is positional or keyword and None by default, as SGLang's."""
    keywords = [(spec.names_on("gen")[0], _KEYWORD_TYPES[spec.kind]) for spec in fields]
    cut = next((i for i, spec in enumerate(fields) if spec.kind == "grammar"), len(fields))
    entries = [("name", str | None), *keywords[:cut], *_OWN_ARGUMENTS.items(), *keywords[cut:]]
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    return inspect.Signature(
        [inspect.Parameter(n, kind, default=None, annotation=a) for n, a in entries],
        return_annotation=Gen | Select,
    )


# gen()'s keywords the table names -> their fields, in the table's (SGLang's) order
_GEN_FIELDS: dict[str, SamplingField] = {spec.names_on("gen")[0]: spec for spec in fields_on("gen")}
_GEN_CONSTRAINTS = tuple(key for key, spec in _GEN_FIELDS.items() if spec.kind == "grammar")
gen.__signature__ = gen_signature(tuple(_GEN_FIELDS.values()))  # type: ignore[attr-defined]


def _bound_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """gen()'s given arguments by name, bound to its signature as Python binds a call.

    Raises:
        TypeError: an argument gen does not take, too many, or one given twice.
    """
    try:
        return dict(gen.__signature__.bind(*args, **kwargs).arguments)  # type: ignore[attr-defined]
    except TypeError as e:
        raise TypeError(f"gen() {e}") from None


def _normalised(key: str, spec: SamplingField, value: Any) -> Any:
    """A keyword's value as GenParams holds it (a list as a tuple), checked here where
    building SamplingParams (``_check_sampling``) would say less.

    Raises:
        ProgramArgumentError: a value of the wrong shape, or a bad pattern or schema.
    """
    if value is None:
        return None
    by_field = _BY_FIELD.get(spec.name)
    if by_field is not None:
        return by_field(value)
    by_kind = _BY_KIND.get(spec.kind)
    return value if by_kind is None else by_kind(key, value)


def _stop_regex(value: Any) -> tuple[str, ...] | None:
    return _patterns(_strings("stop_regex", value))


def _regex(value: Any) -> str:
    return _pattern("regex", value)


def _token_ids_of(_key: str, value: Any) -> tuple[int, ...] | None:
    return _token_ids(value)


_BY_FIELD: dict[str, Callable[[Any], Any]] = {
    "stop_regex": _stop_regex,
    "regex": _regex,
    "json_schema": _schema_text,
}
_BY_KIND: dict[str, Callable[[str, Any], Any]] = {"strings": _strings, "token_ids": _token_ids_of}


# What gen checks by building SamplingParams: every field the table exposes on gen but
# the constraints, which _pattern and _schema_text have checked already.
_SAMPLING_FIELDS = tuple(spec.name for spec in _GEN_FIELDS.values() if spec.kind != "grammar")


def _check_sampling(name: str | None, params: GenParams) -> None:
    """Checks every given sampling value the way the runtime will, now."""
    given = {f: getattr(params, f) for f in _SAMPLING_FIELDS if getattr(params, f) is not None}
    min_new = given.get("min_new_tokens")
    if isinstance(min_new, int) and min_new > 0 and "max_new_tokens" not in given:
        given["max_new_tokens"] = min_new  # the run() default decides; only min is checked
    for field in ("logprob_start_len", "top_logprobs_num"):
        value = getattr(params, field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ProgramArgumentError(f"gen {name!r}: {field} must be an int, got {value!r}")
    try:
        SamplingParams(**given)
    except InvalidRequestError as e:
        raise ProgramArgumentError(f"gen {name!r}: {e}") from e
