"""The one definition of the sampling parameters: type, default, bound, and the name each
surface gives them.

Every way into the engine reads this table instead of spelling the limits out again::

    SAMPLING_FIELDS ──> SamplingParams.__post_init__   (the engine's checks, its messages)
                   ├──> gen(...) / run(...)              (lang: keywords and run defaults)
                   ├──> radixlm run / generate's flags   (entrypoints/cli_sampling)
                   ├──> /v1/chat/completions, /v1/completions, /v1/responses
                   │                                      (http/openai/sampling_bounds: pydantic)
                   └──> /generate's sampling_params       (SamplingParams.from_dict itself)

So a value one surface accepts, every surface that exposes the field accepts, and a
value one refuses, all refuse, with the same message. The exceptions are listed here
(``SurfaceBound``) with the reason the surface's own contract gives.

Surfaces, and what a field's names on them mean:

    engine       SamplingParams' field (``Engine.generate``'s dict key): always ``name``
    generate     /generate's ``sampling_params`` keys: ``name`` and SGLang's aliases
    gen          the DSL's ``gen(...)`` keyword; the table's order is gen's (SGLang's
                 signature, positional calls included): a field new to gen goes after
                 ``json_schema``, so the positions SGLang's programs use stay
    run          the DSL's ``run(...)`` / ``run_batch(...)`` default (under ``name``)
    chat, completions, responses
                 the OpenAI routes' body fields; where several name one field, the first
                 one set wins (``max_completion_tokens`` over ``max_tokens``)
    cli          ``radixlm run`` / ``radixlm generate``'s flag: ``--`` and the engine name
                 in kebab case. The numbers and switches a person tunes at a prompt:
                 token counts, the sampler's knobs and penalties, the seed, ignore_eos;
                 not ``n`` (one reply streams), the stop lists and grammars (shapes:
                 the HTTP API's), the special-token and trim switches (output details)
                 nor the engine-bounded ones (speculation, reasoning, JSON whitespace)

Kinds ``float``, ``int`` and ``bool`` are checked by ``SamplingField.check``; the others
(``strings``, ``token_ids``, ``grammar``, ``option``) by SamplingParams' own normalisers,
because their values are shapes (lists, grammars), not points on a line.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from radixlm.runtime.constrained.json_strings import MAX_STRING_LENGTH
from radixlm.runtime.errors import InvalidSamplingParamsError

__all__ = [
    "CHECKED_KINDS",
    "SAMPLING_FIELDS",
    "SURFACES",
    "Bound",
    "FieldKind",
    "SamplingField",
    "Surface",
    "SurfaceBound",
    "fields_on",
    "sampling_field",
]

Surface = Literal["engine", "generate", "gen", "run", "chat", "completions", "responses", "cli"]
SURFACES: tuple[Surface, ...] = (
    "engine",
    "generate",
    "gen",
    "run",
    "chat",
    "completions",
    "responses",
    "cli",
)
FieldKind = Literal["float", "int", "bool", "strings", "token_ids", "grammar", "option"]
CHECKED_KINDS: frozenset[str] = frozenset({"float", "int", "bool"})
_OPENAI: tuple[Surface, ...] = ("chat", "completions")


@dataclass(frozen=True)
class Bound:
    """An interval (either end may be open or missing) and the values allowed outside it.

    ``also``: values valid though outside the interval, each meaning ``also_means``
    (top_k's -1: off).
    """

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    also: tuple[float, ...] = ()
    also_means: str = ""

    def contains(self, value: float) -> bool:
        if value in self.also:
            return True
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def describe(self) -> str:
        """The bound in words, as error messages say it: ``a value in [0, 100]``, ``>= 0``."""
        if self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            text = f"a value in {left}{self.low:g}, {self.high:g}{right}"
        elif self.low is not None:
            text = f"{'>' if self.low_open else '>='} {self.low:g}"
        elif self.high is not None:
            text = f"at most {self.high:g}" if not self.high_open else f"< {self.high:g}"
        else:
            text = "any value"
        extra = " or ".join(f"{v:g} ({self.also_means})" for v in self.also)
        return f"{extra} or {text}" if extra else text


@dataclass(frozen=True)
class SurfaceBound:
    """A surface whose own contract bounds a field differently from the engine."""

    surface: Surface
    bound: Bound
    reason: str


@dataclass(frozen=True)
class SamplingField:
    """One sampling parameter.

    Attributes:
        name: SamplingParams' field, SGLang's ``sampling_params`` key.
        kind: what values it takes; ``CHECKED_KINDS`` are checked by ``check``.
        default: SamplingParams' default (the engine's; a surface may default otherwise,
            e.g. completions' ``max_tokens`` 16, as OpenAI).
        bound: the values the engine accepts (float and int kinds).
        nullable: None is a value of its own (``seed``: unseeded), not only "the default".
        names: surface -> the names it takes there (absent: not exposed there).
        exceptions: surfaces that bound it differently, and why.
        why: why the bound is where it is.
    """

    name: str
    kind: FieldKind
    default: Any
    bound: Bound | None = None
    nullable: bool = False
    names: Mapping[Surface, tuple[str, ...]] = field(default_factory=dict)
    exceptions: tuple[SurfaceBound, ...] = ()
    why: str = ""

    def names_on(self, surface: Surface) -> tuple[str, ...]:
        """The names ``surface`` gives this field; () where it is not exposed."""
        return self.names.get(surface, ())

    def bound_on(self, surface: Surface) -> Bound | None:
        """The bound ``surface`` applies: its exception's, else the engine's."""
        for exception in self.exceptions:
            if exception.surface == surface:
                return exception.bound
        return self.bound

    def check(self, value: Any, surface: Surface = "engine") -> None:
        """Checks one value as ``surface`` does (None passes where ``nullable``).

        Raises:
            InvalidSamplingParamsError: naming the field (its engine name), what was
                expected and what arrived.
        """
        if value is None and self.nullable:
            return
        checker = _CHECKERS.get(self.kind)
        if checker is not None:
            checker(self.name, value, self.bound_on(surface))


def _check_bool(name: str, value: Any, bound: Bound | None) -> None:
    if not isinstance(value, bool):
        raise InvalidSamplingParamsError(name, f"expected a bool, got {value!r}")


def _check_int(name: str, value: Any, bound: Bound | None) -> None:
    # bool is an int subclass, but True as a token count is always a mistake.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidSamplingParamsError(name, f"expected an int, got {value!r}")
    if bound is not None and not bound.contains(value):
        raise InvalidSamplingParamsError(name, f"expected {bound.describe()}, got {value}")


def _check_float(name: str, value: Any, bound: Bound | None) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidSamplingParamsError(name, f"expected a number, got {value!r}")
    if not math.isfinite(value):
        raise InvalidSamplingParamsError(name, f"expected a finite number, got {value!r}")
    if bound is not None and not bound.contains(value):
        raise InvalidSamplingParamsError(name, f"expected {bound.describe()}, got {value}")


_CHECKERS: dict[str, Callable[[str, Any, Bound | None], None]] = {
    "bool": _check_bool,
    "int": _check_int,
    "float": _check_float,
}


def _field(
    name: str,
    kind: FieldKind,
    default: Any,
    bound: Bound | None = None,
    *,
    nullable: bool = False,
    gen: str | None = None,
    run: bool = False,
    openai: tuple[str, ...] = (),
    chat: tuple[str, ...] = (),
    completions: tuple[str, ...] = (),
    responses: tuple[str, ...] = (),
    generate_aliases: tuple[str, ...] = (),
    cli: bool = False,
    exceptions: tuple[SurfaceBound, ...] = (),
    why: str = "",
) -> SamplingField:
    """A field; ``openai`` names it on chat and completions alike (``chat`` /
    ``completions`` add that route's own names first); ``cli``: a ``--kebab-case`` flag."""
    names: dict[Surface, tuple[str, ...]] = {
        "engine": (name,),
        "generate": (name, *generate_aliases),
    }
    if gen is not None:
        names["gen"] = (gen,)
    if run:
        names["run"] = (name,)
    if chat or openai:
        names["chat"] = (*chat, *openai)
    if completions or openai:
        names["completions"] = (*completions, *openai)
    if responses:
        names["responses"] = responses
    if cli:
        names["cli"] = ("--" + name.replace("_", "-"),)
    return SamplingField(
        name, kind, default, bound, nullable, MappingProxyType(names), exceptions, why
    )


_NON_NEGATIVE = Bound(low=0)
# A chat turn or a response is the model's reply: asking for none of it is a client's
# mistake. Scoring a prompt alone (0 tokens) is completions' and /generate's.
_REPLY = (
    "a chat turn or a response is the model's reply: at least one token (0, scoring the "
    "prompt alone, is completions' and /generate's)"
)

SAMPLING_FIELDS: tuple[SamplingField, ...] = (
    _field(
        "max_new_tokens",
        "int",
        128,
        _NON_NEGATIVE,
        gen="max_tokens",
        run=True,
        chat=("max_completion_tokens", "max_tokens"),
        completions=("max_tokens",),
        responses=("max_output_tokens",),
        cli=True,
        exceptions=(
            SurfaceBound("chat", Bound(low=1), _REPLY),
            SurfaceBound("responses", Bound(low=1), _REPLY),
        ),
        why="0 scores the prompt only; the context length bounds it per model",
    ),
    _field(
        "min_new_tokens",
        "int",
        0,
        _NON_NEGATIVE,
        gen="min_tokens",
        openai=("min_tokens",),
        generate_aliases=("min_tokens",),  # vLLM's name, in /generate's sampling_params
        cli=True,
    ),
    _field("n", "int", 1, Bound(low=1), gen="n", openai=("n",)),
    _field("stop", "strings", (), gen="stop", run=True, openai=("stop",)),
    _field(
        "stop_token_ids",
        "token_ids",
        (),
        gen="stop_token_ids",
        run=True,
        openai=("stop_token_ids",),
    ),
    _field("stop_regex", "strings", (), gen="stop_regex", run=True, openai=("stop_regex",)),
    _field(
        "temperature",
        "float",
        1.0,
        Bound(0, 100),
        gen="temperature",
        run=True,
        openai=("temperature",),
        responses=("temperature",),
        cli=True,
        why="the sampler works in float32: a logit divided by a temperature below 1e-6 "
        "(greedy) times a repetition penalty of 0.01 stays finite; past 100 the "
        "distribution is already uniform. OpenAI documents [0, 2]; vLLM's and SGLang's "
        "servers take more, and so does radixlm, on every route",
    ),
    _field(
        "top_p",
        "float",
        1.0,
        Bound(0, 1, low_open=True),
        gen="top_p",
        run=True,
        openai=("top_p",),
        responses=("top_p",),
        cli=True,
    ),
    _field(
        "top_k",
        "int",
        -1,
        Bound(low=1, also=(-1,), also_means="off"),
        gen="top_k",
        run=True,
        openai=("top_k",),
        cli=True,
    ),
    _field("min_p", "float", 0.0, Bound(0, 1), gen="min_p", run=True, openai=("min_p",), cli=True),
    _field(
        "repetition_penalty",
        "float",
        1.0,
        Bound(0.01, 100),
        openai=("repetition_penalty",),
        cli=True,
        why="float32, as temperature: past these bounds the choice is already one token",
    ),
    _field(
        "frequency_penalty",
        "float",
        0.0,
        Bound(-2, 2),
        gen="frequency_penalty",
        run=True,
        openai=("frequency_penalty",),
        cli=True,
        why="as OpenAI and SGLang: additive penalties beyond +-2 only make text degenerate",
    ),
    _field(
        "presence_penalty",
        "float",
        0.0,
        Bound(-2, 2),
        gen="presence_penalty",
        run=True,
        openai=("presence_penalty",),
        cli=True,
        why="as frequency_penalty",
    ),
    _field(
        "ignore_eos",
        "bool",
        False,
        gen="ignore_eos",
        run=True,
        openai=("ignore_eos",),
        cli=True,
    ),
    _field("skip_special_tokens", "bool", True, openai=("skip_special_tokens",)),
    _field(
        "spaces_between_special_tokens", "bool", True, openai=("spaces_between_special_tokens",)
    ),
    _field(
        "seed",
        "int",
        None,
        nullable=True,
        openai=("seed",),
        generate_aliases=("sampling_seed",),
        cli=True,
    ),
    _field("no_stop_trim", "bool", False, openai=("no_stop_trim", "include_stop_str_in_output")),
    _field("regex", "grammar", None, nullable=True, gen="regex", openai=("regex",)),
    _field(
        "json_schema",
        "grammar",
        None,
        nullable=True,
        gen="json_schema",
        completions=("json_schema",),
    ),
    _field("ebnf", "grammar", None, nullable=True, openai=("ebnf",)),
    _field("lark", "grammar", None, nullable=True, openai=("lark",)),
    # gen(choices=...) is a select (scored choices), not this constraint.
    _field("choices", "grammar", None, nullable=True, openai=("choices",)),
    _field("structural_tag", "grammar", None, nullable=True, chat=("structural_tag",)),
    _field("grammar_backend", "option", None, nullable=True),
    _field("jump_forward", "bool", None, nullable=True),
    _field(
        "json_max_whitespace",
        "int",
        0,
        Bound(0, 8),
        why="more whitespace than this between JSON tokens only lets a model ramble",
    ),
    _field("json_schema_lenient", "bool", False, openai=("json_schema_lenient",)),
    _field("json_bounded_numbers", "bool", None, nullable=True, openai=("json_bounded_numbers",)),
    _field(
        "max_reasoning_tokens",
        "int",
        None,
        _NON_NEGATIVE,
        nullable=True,
        gen="max_reasoning_tokens",
        openai=("max_reasoning_tokens",),
        responses=("max_reasoning_tokens",),
        why="0 answers at once; reasoning tokens count in max_new_tokens too",
    ),
    _field(
        "speculative_num_tokens",
        "int",
        None,
        Bound(0, 16),
        nullable=True,
        openai=("speculative_num_tokens",),
        why="0 turns speculation off for the request; the engine's own K caps it",
    ),
    # The chat route sets it from the tool format (not a client's field there).
    _field("special_tokens_as_text", "strings", ()),
    _field(
        "json_max_string_length",
        "int",
        None,
        Bound(1, MAX_STRING_LENGTH, also=(0,), also_means="off"),
        nullable=True,
        gen="json_max_string_length",
        openai=("json_max_string_length",),
        why="a string longer than this is a document, not a field, and outlines' FSM "
        "grows by a state per character of it; 0 turns the engine's default off",
    ),
)

_BY_NAME = MappingProxyType({f.name: f for f in SAMPLING_FIELDS})


def sampling_field(name: str) -> SamplingField:
    """The field SamplingParams calls ``name``.

    Raises:
        KeyError: no such field.
    """
    return _BY_NAME[name]


def fields_on(surface: Surface) -> Iterator[SamplingField]:
    """The fields ``surface`` exposes, in the table's order."""
    return (f for f in SAMPLING_FIELDS if f.names_on(surface))
