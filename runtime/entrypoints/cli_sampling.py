"""The sampling flags of ``radixlm run`` and ``radixlm generate``, made from the sampling
table (``runtime/io/sampling_fields``, its ``cli`` surface) rather than written by hand.

Each field the table names on ``cli`` is one flag (``--top-k``), checked as the engine
checks it while the command line is parsed, before any model loads: a bad value is
argparse's error (exit 2) naming the flag and the bound. A bool field is a switch
(``--ignore-eos``). A subcommand gives its own defaults (``run`` chats warmer than
``generate``); a field without one is sent only when the flag is given, so the engine's
default holds.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from radixlm.runtime.errors import InvalidSamplingParamsError
from radixlm.runtime.io.sampling_fields import SamplingField, fields_on

__all__ = ["GENERATE_DEFAULTS", "RUN_DEFAULTS", "add_sampling_flags", "sampling_params"]

RUN_DEFAULTS: Mapping[str, Any] = {"max_new_tokens": 512, "temperature": 0.7, "top_p": 0.9}
GENERATE_DEFAULTS: Mapping[str, Any] = {"max_new_tokens": 128, "temperature": 0.0, "top_p": 1.0}
# args.<DEST><field name> holds a flag's value; None: not given and no default
DEST = "sampling_"
_PARSE: dict[str, Callable[[str], Any]] = {"int": int, "float": float}


def add_sampling_flags(
    parser: argparse.ArgumentParser,
    defaults: Mapping[str, Any],
    fields: Iterable[SamplingField] | None = None,
) -> None:
    """Adds a ``sampling`` group to ``parser``: one flag per field on the ``cli`` surface.

    Args:
        parser: the subcommand's parser.
        defaults: field name -> the subcommand's default.
        fields: the fields to add (default: the table's on ``cli``; tests pass others).

    Raises:
        ValueError: a default names no field among ``fields``.
    """
    specs = list(fields_on("cli") if fields is None else fields)
    unknown = set(defaults) - {spec.name for spec in specs}
    if unknown:
        raise ValueError(f"defaults for no sampling flag: {sorted(unknown)}")
    group = parser.add_argument_group("sampling (runtime/io/sampling_fields)")
    for spec in specs:
        _add_flag(group, spec, defaults.get(spec.name))


def sampling_params(args: argparse.Namespace) -> dict[str, Any]:
    """The sampling dict for ``Engine.generate``: the flags given or defaulted."""
    return {
        key[len(DEST) :]: value
        for key, value in vars(args).items()
        if key.startswith(DEST) and value is not None
    }


def _add_flag(group: argparse._ArgumentGroup, spec: SamplingField, default: Any) -> None:
    """One field's flag; ``default``: the subcommand's (None: the engine's holds)."""
    flags = spec.names_on("cli")
    shown = spec.default if default is None else default
    if spec.kind == "bool":
        group.add_argument(
            *flags,
            dest=DEST + spec.name,
            action="store_true",
            default=default,
            help=f"a switch (default: {shown})",
        )
        return
    bound = spec.bound_on("cli")
    limits = "" if bound is None else f"{bound.describe()}; "
    group.add_argument(
        *flags,
        dest=DEST + spec.name,
        type=_flag_type(spec),
        default=default,
        metavar=spec.kind.upper(),
        help=f"{limits}default: {shown}",
    )


def _flag_type(spec: SamplingField) -> Callable[[str], Any]:
    """argparse's ``type`` for a field: the text as a number, checked as the engine
    checks it. The function raises ``argparse.ArgumentTypeError`` (not a number of the
    field's kind, or out of bounds), which argparse reports naming the flag.

    Raises:
        ValueError: the field is no int or float (no flag can type its value).
    """
    parse = _PARSE.get(spec.kind)
    if parse is None:
        raise ValueError(f"sampling field {spec.name!r} of kind {spec.kind} has no flag")
    expected = "an int" if spec.kind == "int" else "a number"

    def checked(text: str) -> Any:
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        try:
            spec.check(value, "cli")
        except InvalidSamplingParamsError as e:
            raise argparse.ArgumentTypeError(e.reason) from None
        return value

    return checked
